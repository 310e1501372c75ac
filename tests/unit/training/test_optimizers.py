"""dagtrain's optimizers: torch's (Adam and AdamW their step in slices), none loading torch's
compiler (optimizers.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from dagtrain.training.rank import optimizers

CASES = [
    (optimizers.Adam, torch.optim.Adam, {"weight_decay": 0.0}),
    (optimizers.Adam, torch.optim.Adam, {"weight_decay": 0.01}),
    (optimizers.Adam, torch.optim.Adam, {"amsgrad": True}),
    (optimizers.AdamW, torch.optim.AdamW, {"weight_decay": 0.01}),
    # the foreach path (torch's default on CUDA), run here on CPU: each slice a list
    (optimizers.Adam, torch.optim.Adam, {"weight_decay": 0.01, "foreach": True}),
    (optimizers.AdamW, torch.optim.AdamW, {"amsgrad": True, "foreach": True}),
]


def twins(shapes: list[tuple[int, ...]]) -> tuple[list[torch.nn.Parameter], ...]:
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    return a, [torch.nn.Parameter(p.detach().clone()) for p in a]


def grads(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> None:
    for p, q in zip(a, b):
        g = torch.randn(p.shape)
        p.grad, q.grad = g.clone(), g.clone()


def step_alike(mine, ref, a, b, steps: int) -> None:
    """``steps`` steps of both on the same gradients; then the same parameters and
    state, bit for bit."""
    for _ in range(steps):
        grads(a, b)
        mine.step()
        ref.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        assert mine.state[p].keys() == ref.state[q].keys()
        for k in ref.state[q]:
            assert torch.equal(mine.state[p][k], ref.state[q][k]), k


@pytest.mark.parametrize(("ours", "theirs", "kw"), CASES)
def test_a_sliced_step_is_torchs_bit_for_bit(ours, theirs, kw) -> None:
    # slices of 1024 elements: the large tensors are cut (one not a multiple of it, one
    # not contiguous: updated whole), the small ones batched
    shapes = [(300, 4099), (7,), (33, 65), (5000,)]
    a, b = twins(shapes)
    # and a transposed one: no flat view, updated whole
    t = torch.randn(40, 70)
    a.append(torch.nn.Parameter(t.clone().t()))
    b.append(torch.nn.Parameter(t.clone().t()))
    assert not a[-1].is_contiguous()
    mine, ref = ours(a, lr=1e-3, **kw), theirs(b, lr=1e-3, **kw)
    mine.slice = 1024
    step_alike(mine, ref, a, b, 4)
    assert float(mine.state[a[0]]["step"]) == 4.0


def test_its_state_loads_into_torchs_and_back() -> None:
    a, b = twins([(64, 100)])
    mine, ref = optimizers.AdamW(a, lr=1e-2), torch.optim.AdamW(b, lr=1e-2)
    mine.slice = 1000
    grads(a, b)
    mine.step()
    ref.load_state_dict(copy.deepcopy(mine.state_dict()))  # (it would share tensors)
    b[0].data.copy_(a[0].data)
    grads(a, b)
    mine.step()
    ref.step()
    assert torch.equal(a[0], b[0])
    # and torch's state into ours
    mine.load_state_dict(copy.deepcopy(ref.state_dict()))
    grads(a, b)
    mine.step()
    ref.step()
    assert torch.equal(a[0], b[0])
    assert float(mine.state[a[0]]["step"]) == 3.0
    assert isinstance(mine, torch.optim.AdamW)


def test_a_large_parameter_is_cut_and_its_step_counted_once() -> None:
    p = torch.zeros(10_000)
    grad = torch.zeros(10_000)
    avg, sq = torch.zeros(10_000), torch.zeros(10_000)
    small = [torch.zeros(3) for _ in range(4)]
    step = torch.tensor(2.0)
    pieces = optimizers._pieces(
        ([small[0], p], [small[1], grad], [small[2], avg], [small[3], sq], [], [step, step]),
        4096,
    )
    sizes = [[t.numel() for t in piece[0]] for piece in pieces]
    assert sizes == [[3], [4096], [4096], [1808]]
    # each piece's step a copy: the functional step counts it up, not the parameter's
    assert all(s is not step and float(s) == 2.0 for piece in pieces for s in piece[5])
    assert pieces[2][0][0].data_ptr() == p.data_ptr() + 4096 * 4  # a view, not a copy


def test_sgd_steps_as_torchs_bit_for_bit() -> None:
    a, b = twins([(300, 41), (7,)])
    mine = optimizers.SGD(a, lr=0.1, momentum=0.9, weight_decay=0.01)
    ref = torch.optim.SGD(b, lr=0.1, momentum=0.9, weight_decay=0.01)
    step_alike(mine, ref, a, b, 3)
    assert "momentum_buffer" in mine.state[a[0]]
    assert isinstance(mine, torch.optim.SGD)


# a fresh interpreter with what a rank imports: the built-in transformer's forward on
# the meta device (a pipeline rank's description of its stages: torch's meta kernels and
# decompositions, which torch marks too); each of its optimizers built, stepped (step
# hooks called once a step), its state out and in; a plain torch SGD built beside them
# (torch hooks its class's step); then torch's own optimizers, which load the compiler,
# and ours again, their marks now torch's
NO_COMPILER = """
import sys, torch
import dagtrain.training.rank.__main__
from dagtrain.config import TrainConfig
from dagtrain.training.rank.models import build_model
from dagtrain.training.rank.optimizers import make_optimizer
from dagtrain.training.rank.uncompiled import leave_compiler_unloaded

# a pipeline rank's description of its stages: the model on the meta device, forward
leave_compiler_unloaded()  # (what a rank's train() does first)
with torch.device("meta"):
    described = build_model("transformer", (8, 8), 10, layers=2, dim=32, heads=4)
    with torch.no_grad():
        shape = tuple(described(torch.zeros(1, 8, 8)).shape)

def run(make):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50, 30))
    o = make([p])
    calls = []
    o.register_step_pre_hook(lambda *a: calls.append(1))
    for _ in range(3):
        p.grad = torch.randn(50, 30)
        o.step()
        o.zero_grad()
    o.load_state_dict(o.state_dict())
    assert len(calls) == 3, calls
    return p.detach().clone()

kw = {"sgd": dict(momentum=0.9, weight_decay=0.01), "adam": dict(weight_decay=0.01),
      "adamw": dict(weight_decay=0.01)}
theirs = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
cfgs = {n: TrainConfig(backend="torch", ranks=1, optimizer=n, lr=0.01, **kw[n]) for n in kw}
ours = {n: run(lambda ps: make_optimizer(cfgs[n], ps)) for n in kw}
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
assert torch.equal(run(lambda ps: make_optimizer(cfgs["sgd"], ps)), ours["sgd"])
loaded = "torch._dynamo" in sys.modules
for n in kw:
    assert torch.equal(ours[n], run(lambda ps: theirs[n](ps, lr=0.01, **kw[n]))), n
assert "torch._dynamo" in sys.modules
for n in kw:
    assert torch.equal(run(lambda ps: make_optimizer(cfgs[n], ps)), ours[n]), n
for m in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
    mark = getattr(torch.optim.Optimizer, m).__wrapped__.__dynamo_disable
    assert getattr(mark, "_torchdynamo_disable", False), m  # torch's own
with torch.device("meta"), torch.no_grad():
    assert tuple(described(torch.zeros(1, 8, 8)).shape) == shape == (1, 10)
# the compiler loaded, ours built again: no mark of ours is left on any function
import gc, torch._compile
probe = torch._compile._disable_dynamo(len)
at = probe.__code__.co_freevars.index("fn")
marks = [getattr(o.__closure__[at].cell_contents, "__dynamo_disable", None)
         for o in gc.get_objects() if type(o) is type(probe) and o.__code__ is probe.__code__]
assert len(marks) > 100 and not [m for m in marks if getattr(m, "lazy", False)]
print("loaded" if loaded else "not loaded")
"""


def test_no_optimizer_of_a_rank_loads_torchs_compiler() -> None:
    """torch imports torch._dynamo (over a second of CPU) to mark its optimizers' methods
    and its meta kernels "not compiled"; a rank makes the marks lazy (uncompiled.py), and
    its SGD steps alike."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", NO_COMPILER],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["not", "loaded"], r.stdout + r.stderr[-2000:]
