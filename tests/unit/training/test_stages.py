"""A pipeline rank's model: each stage's keys, refused ties, loading its own part."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dagtrain.config import TrainConfig
from dagtrain.errors import InputError
from dagtrain.training.rank.materialize import materialize
from dagtrain.training.rank.optimizers import make_optimizer
from dagtrain.training.rank.split import Split, blocks_of
from dagtrain.training.rank.stage_state import StageState
from dagtrain.training.rank.stages import load_own, own_state, stage_keys


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8))


def test_each_stage_holds_its_blocks_keys_and_loads_only_them():
    with torch.device("meta"):
        meta = model()
    split = Split([2], 4, "explicit")
    keys = stage_keys(meta, blocks_of(meta), split)
    assert keys[0] == ["0.weight", "0.bias"]
    assert keys[1][:2] == ["2.weight", "2.bias"] and "3.running_mean" in keys[1]
    torch.manual_seed(0)
    whole = model()
    torch.manual_seed(0)
    stage1 = materialize(model, set(keys[1]))
    assert set(own_state(stage1)) == set(keys[1])  # the other stage only described
    ref = {k: v + 1 for k, v in whole.state_dict().items()}
    load_own(stage1, ref, "ckpt-00000004.pt")  # the whole state: its part taken
    assert torch.equal(stage1[2].weight, ref["2.weight"])
    assert stage1[0].weight.is_meta
    with pytest.raises(InputError, match=r"ckpt-00000004.pt has no \['2.weight'\]"):
        load_own(stage1, {k: v for k, v in ref.items() if k != "2.weight"}, "ckpt-00000004.pt")


def test_a_tensor_shared_by_two_stages_is_refused_naming_it():
    tied = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    tied[1].weight = tied[0].weight  # an input embedding tied to the output layer
    with pytest.raises(
        InputError, match=r"'0.weight' and '1.weight' are one tensor, used by stage 0 and stage 1"
    ):
        stage_keys(tied, blocks_of(tied), Split([1], 2, "explicit"))
    assert stage_keys(tied, blocks_of(tied), Split([], 2, "explicit")) == [
        ["0.weight", "1.weight", "1.bias"]
    ]


def test_with_chunks_a_stage_holds_its_parts_and_no_tensor_spans_two_of_them():
    four = nn.Sequential(*(nn.Linear(3, 3, bias=False) for _ in range(4)))
    looped = Split([1, 2, 3], 4, "explicit", chunks=2)  # stage 0: parts 0 and 2
    assert looped.parts_of(0) == [0, 2] and looped.label(2) == "stage 0 chunk 1"
    assert stage_keys(four, blocks_of(four), looped) == [
        ["0.weight", "2.weight"],
        ["1.weight", "3.weight"],
    ]
    four[2].weight = four[0].weight  # one rank, but two chunks' backwards would add into it
    with pytest.raises(InputError, match=r"used by stage 0 chunk 0 and stage 0 chunk 1"):
        stage_keys(four, blocks_of(four), looped)


class Masked(nn.Module):
    """A block with a buffer the checkpoint does not hold (persistent=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("mask", torch.tril(torch.ones(4, 4)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) @ self.mask


class Stage1Of2:
    """What build_stages asks of a backend, as rank 1 of 2 sees it."""

    rank, size, device = 1, 2, "cpu"

    def broadcast_object(self, obj, root=0):
        return {"bounds": [1], "blocks": 2, "how": "explicit", "chunks": 1, "placement": "looped"}


def test_a_stage_builds_its_blocks_unsaved_buffers_too():
    from dagtrain.training import TrainConfig
    from dagtrain.training.rank.stages import build_stages

    cfg = TrainConfig(
        backend="torch", ranks=2, batch_size=8, seed=3,
        parallel={"stages": 2, "microbatches": 1, "split": [1]},
    )  # fmt: skip

    def build() -> nn.Sequential:
        return nn.Sequential(nn.Linear(4, 4), Masked())

    got = build_stages(cfg, Stage1Of2(), build, torch.zeros(8, 4))
    torch.manual_seed(3)
    whole = build()
    assert got.keys == [["0.weight", "0.bias"], ["1.lin.weight", "1.lin.bias"]]
    assert not got.model[1].mask.is_meta and torch.equal(got.model[1].mask, whole[1].mask)
    assert torch.equal(got.model[1].lin.weight, whole[1].lin.weight)
    assert got.model[0].weight.is_meta


def test_a_data_parallel_checkpoints_shared_step_count_is_each_parameters_own_on_a_stage():
    # a data-parallel checkpoint's parameters of one bucket share one step tensor (its
    # flat optimizer's); a stage loading them must count each parameter's step once a
    # step, not once for every parameter that shares it (Adam's bias correction)
    cfg = TrainConfig(optimizer="adam")
    whole = [nn.Parameter(torch.zeros(3)) for _ in range(3)]
    stage = StageState()
    stage.cfg, stage.global_params, stage.params = cfg, whole, whole[1:]
    stage.index = {id(q): i for i, q in enumerate(whole)}
    stage.names = ["a", "b", "c"][1:]
    stage.optimizer = make_optimizer(cfg, stage.params)
    hyper = {k: v for k, v in stage.optimizer.state_dict()["param_groups"][0].items()}
    shared = torch.tensor(5.0)
    moments = {"exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3)}
    per = {i: {"step": shared, **moments} for i in range(3)}
    stage.load_optimizer_states([{"state": per, "param_groups": [{**hyper, "params": [0, 1, 2]}]}])
    for q in stage.params:
        q.grad = torch.ones(3)
    stage.optimizer.step()
    assert [float(stage.optimizer.state[q]["step"]) for q in stage.params] == [6.0, 6.0]
    assert float(shared) == 5.0  # the checkpoint's own tensor untouched
