"""Building one pipeline stage: its tensors as a whole build makes them, the rest on
meta, the generator where a whole build leaves it, the memory of the stage only, and
the refusals (a factory that builds differently, one that reads a tensor it dropped)."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from dagtrain.training.rank.materialize import describe, materialize, owned_names
from dagtrain.training.rank.models import DataInfo, build_model
from dagtrain.training.rank.split import blocks_of

SEED = 1234


class _Drawn(nn.Module):
    """Tensors drawn by random factories, an orthogonal init, an embedding."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n))
        self.u = nn.Parameter(torch.normal(0.0, 0.5, size=(n,)))
        self.register_buffer("ids", torch.randint(0, 10, (n,)))
        self.register_buffer("steps", torch.arange(n))
        self.q = nn.Parameter(torch.empty(n, n))
        nn.init.orthogonal_(self.q)
        self.e = nn.Embedding(12, n, padding_idx=0)
        self.v = nn.Parameter(torch.randn_like(self.w) * 0.1)


class _Scaled(nn.Module):
    """Re-initialised after construction, a temporary multiplied into a parameter, a
    BatchNorm's buffers, a bfloat16 layer."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)
        nn.init.normal_(self.lin.weight, std=0.02)
        scale = torch.rand(n)  # a temporary: its values flow into self.gain
        self.gain = nn.Parameter(torch.ones(n, n) * scale)
        self.bn = nn.BatchNorm1d(n)
        self.half = nn.Linear(n, 4, dtype=torch.bfloat16)


def _user(n: int = 8) -> nn.Module:
    return nn.Sequential(_Drawn(n), _Scaled(n), nn.ReLU(), _Drawn(n), _Scaled(n))


_LM = DataInfo((12,), 50, "int64", objective="language_model")
BUILDS = {
    "mlp": lambda: build_model("mlp", (4, 5), 3, hidden=(16, 16)),
    "cnn": lambda: build_model("cnn", (1, 8, 8), 3, channels=4),
    "rescnn": lambda: build_model("rescnn", (1, 8, 8), 3, channels=4, blocks=2),
    "transformer": lambda: build_model("transformer", (6, 5), 3, dim=16, heads=2, layers=3),
    "causal_lm": lambda: build_model("transformer", (12,), 50, _LM, dim=16, heads=2, layers=3),
    "user": _user,
}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    named = itertools.chain(
        model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)
    )
    return dict(named)


def _whole(build):
    torch.manual_seed(SEED)
    model = build()
    return _state(model), torch.get_rng_state()


def _stages(n: int) -> set[tuple[int, int]]:
    """Every stage (first block, end) of every contiguous split of n blocks in 2 or 3."""
    stages = set()
    for k in (2, 3):
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = [0, *cuts, n]
            stages |= set(zip(edges, edges[1:]))
    return stages


@pytest.mark.parametrize("name", BUILDS)
def test_each_stage_holds_what_a_whole_build_gives_it(name):
    build = BUILDS[name]
    whole, rng = _whole(build)
    rng_before = torch.get_rng_state()
    description = describe(build)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the meta build draws nothing
    blocks = blocks_of(description.model)
    checked = 0
    for a, b in sorted(_stages(len(blocks))):
        owned = owned_names(description.model, blocks[a:b])
        torch.manual_seed(SEED)
        model = materialize(build, owned, description)
        assert torch.equal(torch.get_rng_state(), rng), (name, a, b)
        got = _state(model)
        assert got.keys() == whole.keys()
        for fqn, t in got.items():
            ref = whole[fqn]
            assert (t.shape, t.dtype, t.requires_grad) == (ref.shape, ref.dtype, ref.requires_grad)
            assert isinstance(t, nn.Parameter) == isinstance(ref, nn.Parameter), fqn
            if fqn in owned:
                assert t.device.type == "cpu" and torch.equal(t, ref), (name, a, b, fqn)
                checked += 1
            else:
                assert t.device.type == "meta", (name, a, b, fqn)
    assert checked >= len(whole)  # every tensor was owned, and compared, in some stage


def test_a_stage_runs_as_the_whole_model_runs_it():
    torch.manual_seed(SEED)
    whole = _user().eval()
    description = describe(_user)
    blocks = blocks_of(description.model)
    torch.manual_seed(SEED)
    model = materialize(_user, owned_names(description.model, blocks[1:3]), description).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = whole[2](whole[1].bn(whole[1].lin(x) @ whole[1].gain))
        got = model[2](model[1].bn(model[1].lin(x) @ model[1].gain))
    assert torch.equal(got, want)


def _tied() -> nn.Module:
    embed, head = nn.Embedding(10, 6), nn.Linear(6, 10)
    head.weight = embed.weight
    return nn.Sequential(embed, nn.Linear(6, 6), head)


def test_a_tensor_tied_across_stages_stays_real_and_is_reported(caplog):
    whole, _ = _whole(_tied)
    description = describe(_tied)
    owned = {"0.weight"}
    assert description.ties(owned) == [("0.weight", "2.weight")]
    torch.manual_seed(SEED)
    with caplog.at_level(logging.WARNING):
        model = materialize(_tied, owned, description)
    assert "0.weight (owned) and 2.weight (not owned)" in caplog.text
    assert model[2].weight is model[0].weight and torch.equal(model[2].weight, whole["2.weight"])
    assert model[1].weight.is_meta and model[2].bias.is_meta
    # owned_names owns a tied tensor under all its names
    assert owned_names(description.model, [description.model[0]]) == {"0.weight", "2.weight"}


def test_a_factory_that_builds_differently_the_second_time_is_refused():
    for counts in ([3, 4], [4, 3]):  # more tensors the second time, then fewer
        layers = iter(counts)

        def build() -> nn.Module:
            return nn.Sequential(*[nn.Linear(4, 4) for _ in range(next(layers))])

        description = describe(build)
        with pytest.raises(RuntimeError, match="not deterministic"):
            materialize(build, {"0.weight", "0.bias"}, description)


def _copying() -> nn.Module:
    a, other, b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
    with torch.no_grad():
        b.weight.copy_(a.weight)  # reads a's weight after other's tensors were made
    return nn.Sequential(a, other, b)


def test_reading_a_dropped_tensor_is_refused_not_guessed():
    description = describe(_copying)
    with pytest.raises(RuntimeError, match=r"reads 0\.weight .* copy_\(\)"):
        materialize(_copying, {"2.weight", "2.bias"}, description)
    whole, _ = _whole(_copying)  # owning what it reads, it builds
    torch.manual_seed(SEED)
    model = materialize(_copying, {"0.weight", "2.weight"}, description)
    assert torch.equal(model[2].weight, whole["2.weight"]) and model[1].weight.is_meta


def _big() -> nn.Module:
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])  # 128 MiB


def test_a_stage_holds_its_own_tensors_and_one_scratch_buffer():
    description = describe(_big)
    owned = owned_names(description.model, list(description.model)[2:4])  # stage 2 of 4
    model = materialize(_big, owned, description)
    real = {
        t.untyped_storage()._cdata: t.untyped_storage().nbytes()
        for t in _state(model).values()
        if not t.is_meta
    }
    own_bytes = sum(description.model.get_parameter(f).nbytes for f in owned)
    assert sum(real.values()) == own_bytes == 2 * (2048 * 2048 + 2048) * 4
    largest_dropped = max(t.nbytes for f, t in _state(description.model).items() if f not in owned)
    assert description.scratch_bytes(owned) <= largest_dropped == 2048 * 2048 * 4


def _peak_resets() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _peak_resets(), reason="needs Linux's resettable peak RSS (VmHWM)")
def test_the_peak_memory_is_the_stage_and_the_scratch_not_the_model():
    # a fresh process; its peak resident memory reset before each build and read after
    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        from dagtrain.training.rank.materialize import describe, materialize, owned_names

        def status(field):
            with open("/proc/self/status") as f:
                return int(f.read().split(field + ":")[1].split()[0]) * 1024

        def peak():
            return status("VmHWM")

        def reset():
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return peak()

        build = lambda: nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])
        description = describe(build)
        owned = owned_names(description.model, list(description.model)[2:4])
        base = reset()
        model = materialize(build, owned, description)
        stage, held = peak() - base, status("VmRSS") - base
        del model
        base = reset()
        whole = build()
        print(stage, held, peak() - base, description.scratch_bytes(owned))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    stage, held, whole, scratch = map(int, out.stdout.split())
    owned = 2 * (2048 * 2048 + 2048) * 4  # 32 MiB
    assert whole > 120 * 2**20, whole  # the measure sees a whole build's 128 MiB
    assert stage < owned + scratch + 8 * 2**20, (stage, owned, scratch)  # 56 of 128 MiB
    assert held < owned + 4 * 2**20, (held, owned)  # the scratch is given back
