"""The optimizers a rank builds, from ``training.optimizer``.

Adam and AdamW are torch's, with one change: their update of a large parameter runs
in slices of :data:`SLICE` elements. torch's own step makes temporaries of each
parameter's size (the single-tensor path, torch's default on CPU, holds two at once:
``exp_avg_sq.sqrt()`` and its quotient; the foreach path, the default on CUDA, holds
them for every parameter of the group at once), so a model whose largest weight takes
a quarter of a pipeline stage's state needed half as much again at each step
(docs/parallelism.md, "Memory per rank"). Sliced, the temporaries are a few slices of
:data:`SLICE` elements (three with Adam's weight decay) whatever the model — a
non-contiguous tensor, which has no flat view, is updated whole — and the step is
faster: each slice's five
passes (the moments, the square root, the quotient, the update) run over data still in
the cache (the 21M MLP's step about twice as fast: ``benchmarks/adam_step.py``).

The update is torch's functional ``torch.optim.adam.adam`` applied to views of each
slice: the same kernels on the same elements, so the parameters and the state are
torch's, bit for bit (every op of Adam is elementwise, and a slice starts at a
multiple of the vector width). One caveat: with several intra-op threads torch splits
a whole tensor among them at arbitrary elements, where its vectorised loop hands a few
elements to the scalar one, so the equality there rests on the two agreeing, as they
do on this build (tested at 1 and 2 threads). The state and its ``state_dict`` are torch's (a
checkpoint loads into ``torch.optim.Adam`` and back), and ``isinstance(o,
torch.optim.Adam)`` holds.

None of them loads torch's compiler. torch imports ``torch._dynamo`` (about 1.2 s of
CPU, as much as torch's own import) the first time an optimizer is built or steps,
only to mark its methods "not to be compiled" (``torch._disable_dynamo``, and SGD's
step). A rank compiles nothing, so :func:`make_optimizer` has those marks take effect
lazily (:mod:`dagtrain.training.rank.uncompiled`), and SGD's step runs as torch's
decorator runs it while the compiler is not loaded. A rank starts about 1.2 s of CPU
sooner (an elastic world's relaunched rank too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.adam import adam

from dagtrain.training.rank.uncompiled import compiler_loaded, leave_compiler_unloaded

if TYPE_CHECKING:
    from dagtrain.config import TrainConfig

SLICE = 1 << 20  # elements a step's temporaries hold at most: 4 MiB of fp32


def _pieces(
    lists: tuple[list[torch.Tensor], ...], size: int
) -> list[tuple[list[torch.Tensor], ...]]:
    """``lists`` (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or [], steps),
    one entry per parameter, cut into batches of at most ``size`` elements; a tensor
    larger than ``size`` is cut into slices (its step cloned for each: the functional
    step counts it up, the caller counts the real one once)."""
    params, grads, avgs, sqs, maxs, steps = lists
    out: list[tuple[list[torch.Tensor], ...]] = []
    batch: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
    held = 0

    def put(ts: list[torch.Tensor], step: torch.Tensor) -> None:
        nonlocal batch, held
        n = ts[0].numel()
        if held and held + n > size:
            out.append(batch)
            batch, held = ([], [], [], [], [], []), 0
        for i, t in enumerate(ts):
            batch[i].append(t)
        batch[5].append(step.clone())
        held += n

    for i, p in enumerate(params):
        ts = [p, grads[i], avgs[i], sqs[i]] + ([maxs[i]] if maxs else [])
        whole = p.numel() <= size or not all(t.is_contiguous() for t in ts)
        if whole:
            put(ts, steps[i])
            continue
        flat = [t.view(-1) for t in ts]
        for a in range(0, p.numel(), size):
            put([t[a : a + size] for t in flat], steps[i])
    if held:
        out.append(batch)
    return out


class _Sliced:
    """The step of torch's Adam and AdamW, in slices (the module's docstring)."""

    slice = SLICE
    param_groups: list[dict[str, Any]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("dagtrain's optimizers take no closure")
        if any(g["fused"] or g["capturable"] or g["differentiable"] for g in self.param_groups):
            # paths dagtrain never asks for (fused, CUDA graphs, a differentiable step),
            # whose step counts or grad mode this one would not keep: torch's own
            return super().step()  # type: ignore[misc]
        for group in self.param_groups:
            lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
            params, grads, avgs, sqs, maxs, steps = lists
            complex_ = self._init_group(group, params, grads, avgs, sqs, maxs, steps)  # type: ignore[attr-defined]
            beta1, beta2 = group["betas"]
            for p, g, a, s, m, st in _pieces(lists, self.slice):
                adam(
                    p, g, a, s, m, st,
                    amsgrad=group["amsgrad"], has_complex=complex_, beta1=beta1,
                    beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                    eps=group["eps"], maximize=group["maximize"], foreach=group["foreach"],
                    capturable=group["capturable"], differentiable=group["differentiable"],
                    fused=group["fused"], grad_scale=getattr(self, "grad_scale", None),
                    found_inf=getattr(self, "found_inf", None),
                    decoupled_weight_decay=group["decoupled_weight_decay"],
                )  # fmt: skip
            for st in steps:
                st += 1


class SGD(torch.optim.SGD):
    """torch's SGD, its step run as torch's decorator runs it (grad mode off unless the
    group is differentiable) without importing the compiler while it is not loaded."""

    def step(self, closure: Any = None) -> Any:
        torchs = _step_of(torch.optim.SGD)  # (this class has its own profiler hook)
        raw = getattr(torchs, "__wrapped__", None)
        if raw is None or compiler_loaded():
            return torchs(self, closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return raw(self, closure)


def _step_of(cls: type[torch.optim.Optimizer]) -> Callable[..., Any]:
    """``cls.step`` as the class defines it, without the profiler's hook that torch puts
    around it once an instance exists (``Optimizer._patch_step_function``)."""
    step = cls.step
    return step.__wrapped__ if getattr(step, "hooked", False) else step


class Adam(_Sliced, torch.optim.Adam):
    """torch's Adam, its step in slices."""


class AdamW(_Sliced, torch.optim.AdamW):
    """torch's AdamW, its step in slices."""


def make_optimizer(cfg: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    leave_compiler_unloaded()
    t = cfg.training
    if t.optimizer == "sgd":
        # not fused=True: torch's fused CPU kernel is faster (21M parameters: 18 -> 11 ms)
        # but rounds some elements differently from the default one, depending on where
        # they fall in the tensor, so the result would depend on the bucket layout.
        # SGD's step makes no temporary (but with weight decay, one of the parameter)
        return SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return Adam(params, lr=t.lr, weight_decay=t.weight_decay)
    return AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
