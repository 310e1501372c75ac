"""Backward in two halves equals one backward: the input's gradient, then the weights'.
dagtrain/training/rank/split_backward.py wraps torch's private
``torch.distributed.pipelining._backward``; this fails, naming it, when torch changes it."""

from __future__ import annotations

import torch
from torch import nn

from dagtrain.training.rank.split_backward import input_grad, weight_grads

PRIVATE = (
    "torch.distributed.pipelining._backward (wrapped in dagtrain/training/rank/split_backward.py)"
)


def _stage() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    inp = torch.randn(5, 6, requires_grad=True)  # a middle stage's input: a received tensor
    return module, inp, torch.randn(5, 4)  # the next stage's gradient of the output


def test_the_input_then_the_weights_give_what_one_backward_gives():
    module, inp, dout = _stage()
    module(inp).backward(dout)
    want_dx, want = inp.grad.clone(), [p.grad.clone() for p in module.parameters()]

    module, inp, dout = _stage()
    hooked: list[int] = []
    for i, p in enumerate(module.parameters()):
        p.register_hook(lambda g, i=i: hooked.append(i))
    try:
        dx, pending = input_grad(module(inp), dout, inp, module.parameters())
        assert all(p.grad is None for p in module.parameters()), "weights before their turn"
        weight_grads(module.parameters(), pending)
    except (ImportError, TypeError, AttributeError) as e:
        raise AssertionError(f"torch changed {PRIVATE}: {type(e).__name__}: {e}") from e
    assert torch.allclose(dx, want_dx), PRIVATE
    for got, w in zip((p.grad for p in module.parameters()), want, strict=True):
        assert got is not None and torch.allclose(got, w), PRIVATE
    assert sorted(hooked) == [0, 1, 2, 3], "the gradient hooks (bucketed allreduce) fire"


def test_the_last_stage_starts_from_its_loss():
    module, inp, _ = _stage()
    loss = module(inp).square().sum()
    dx, pending = input_grad(loss, None, inp, module.parameters())
    weight_grads(module.parameters(), pending)
    module2, inp2, _ = _stage()
    module2(inp2).square().sum().backward()
    assert torch.allclose(dx, inp2.grad)
    for a, b in zip(module.parameters(), module2.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad)
