"""Splitting a model into pipeline stages: blocks, the balanced split, the refusals."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from dagtrain.config import ConfigError, PipelineConfig, TrainConfig, validate
from dagtrain.errors import InputError
from dagtrain.training.rank.models import build_model
from dagtrain.training.rank.split import balanced_split, blocks_of, check_stages, choose_split


def _brute(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        worst = max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))
        if best is None or worst < best[0]:
            best = (worst, list(cuts))
    return best[0]


@pytest.mark.parametrize("seed", range(20))
def test_the_balanced_split_is_as_good_as_any(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 9, (1,), generator=g))
    costs = torch.rand(n, generator=g).tolist()
    for stages in range(1, n + 1):
        cuts = balanced_split(costs, stages)
        edges = [0, *cuts, n]
        assert len(cuts) == stages - 1 and all(b > a for a, b in zip(edges, edges[1:]))
        worst = max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))
        assert worst == pytest.approx(_brute(costs, stages))


def test_blocks_share_the_models_parameters_and_compute_the_same():
    torch.manual_seed(0)
    for name, args in [("transformer", {"layers": 3}), ("mlp", {}), ("rescnn", {})]:
        model = build_model(name, (64,), 10, **args).eval()
        x = torch.randn(5, 64)
        h = x
        blocks = blocks_of(model)
        for b in blocks:
            h = b(h)
        assert torch.equal(h, model(x)), name
        mine = {id(p) for b in blocks for p in b.parameters()}
        assert mine == {id(p) for p in model.parameters()}, name
    assert len(blocks_of(build_model("transformer", (64,), 10, layers=3))) == 5


def test_a_factory_may_return_a_list_of_modules():
    model = build_model("tests.unit.training.factory:slow_blocks", (64,), 10)
    assert isinstance(model, nn.Sequential) and len(blocks_of(model)) == 8


def test_auto_splits_by_measured_cost_and_says_so():
    model = nn.Sequential(nn.Linear(64, 512), nn.Linear(512, 512), nn.Linear(512, 8))
    s = choose_split(blocks_of(model), 2, "auto", torch.randn(16, 64))
    assert s.how == "auto" and s.bounds in ([1], [2]) and len(s.stage_seconds) == 2
    assert s.describe().startswith("split (auto, 3 blocks): stage 0: block")


def test_a_model_that_cannot_be_split_is_refused_naming_the_field():
    tiny = TrainConfig(model="transformer", backend="torch", ranks=8, parallel={"stages": 8})
    with pytest.raises(InputError, match=r"parallel\.stages is 8 but the model has 4 blocks"):
        check_stages(tiny, {"in_shape": [64], "classes": 10})
    past = TrainConfig(
        model="mlp", model_args={"hidden": [8]}, backend="torch", ranks=2,
        parallel={"stages": 2, "split": [4]},
    )  # fmt: skip
    with pytest.raises(InputError, match=r"parallel\.split \[4\]: the model has 4 blocks"):
        check_stages(past, {"in_shape": [64], "classes": 10})
    with pytest.raises(InputError, match=r"parallel\.stages needs a model whose blocks"):
        blocks_of(build_model("tests.unit.training.factory:slow", (64,), 10))


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"distributed": {"backend": "torch", "ranks": 3}, "parallel": {"stages": 2}},
         "distributed.ranks 3 is not a multiple of parallel.stages 2"),
        ({"distributed": {"backend": "torch", "ranks": 4}, "training": {"batch_size": 60},
          "parallel": {"stages": 2, "microbatches": 4}},
         "training.batch_size 60 does not divide into parallel.microbatches 4 on each of 2"),
        ({"distributed": {"backend": "horovod", "ranks": 2}, "parallel": {"stages": 2}},
         "parallel.stages is 2 but distributed.backend 'horovod'"),
        ({"distributed": {"backend": "local"}, "parallel": {"stages": 2}},
         "distributed.backend 'local'"),
        ({"parallel": {"stages": 2, "split": [1, 2]}}, "parallel.split [1, 2] has 2 boundaries"),
        ({"parallel": {"stages": 2, "split": 3}},
         "parallel.split: give the boundaries as a list, e.g. [3] (stage 0 = blocks 0-2"),
        ({"parallel": {"stages": 3, "split": [2, 2]}}, "boundaries must be increasing"),
        ({"parallel": {"microbatches": 4}}, "parallel.microbatches is 4 with parallel.stages 1"),
        ({"parallel": {"order": "interleaved"}}, "parallel.order"),
    ],
)  # fmt: skip
def test_a_pipeline_config_that_cannot_work_is_refused_naming_the_field(conf, needle):
    with pytest.raises(ConfigError) as info:
        validate({"name": "p", **conf})
    assert needle in str(info.value), str(info.value)


def test_a_pipeline_config_reaches_the_ranks():
    cfg = PipelineConfig(
        distributed={"backend": "torch", "ranks": 4},
        parallel={"stages": 2, "microbatches": 4, "order": "1f1b"},
    )
    t = cfg.train_config()
    assert (t.parallel.stages, t.replicas, t.parallel.order) == (2, 2, "1f1b")
