"""An elastic run's rules without ranks: its config's refusals, the world's slots as
ranks and hosts are lost and come back, which failures count as losses, a world
change as people read it, and the rescues a next world resumes from."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from dagtrain.changes import change_line
from dagtrain.config import ConfigError, PipelineConfig, TrainConfig
from dagtrain.launch import Hosts, RankFailure, RankInputError
from dagtrain.training.driver.elastic import World, is_loss
from dagtrain.training.rank import checkpoint
from dagtrain.training.rank.rescue import newest


@pytest.mark.parametrize(
    ("dist", "training", "says"),
    [
        ({"backend": "torch", "ranks": 3, "min_ranks": 4}, {}, "distributed.min_ranks 4 is more"),
        ({"backend": "local", "ranks": 1, "min_ranks": 1}, {}, None),
        ({"backend": "torch", "ranks": 3, "min_ranks": 2}, {"batch_size": 64}, "does not split"),
        ({"backend": "torch", "ranks": 4, "min_ranks": 2}, {"batch_size": 30}, "over 4 rank(s)"),
    ],
)
def test_the_config_refuses_what_an_elastic_world_cannot_do(dist, training, says):
    data = {"name": "x", "distributed": dist, "training": training}
    if says is None:
        assert not PipelineConfig.model_validate(data).distributed.elastic
        return
    with pytest.raises((ConfigError, ValueError)) as info:
        PipelineConfig.model_validate(data)
    assert says in str(info.value), str(info.value)


def test_an_elastic_pipeline_takes_whole_replicas_and_a_batch_every_world_splits():
    cfg = TrainConfig(
        distributed={"backend": "torch", "ranks": 4, "min_ranks": 2},
        parallel={"stages": 2, "microbatches": 4},
        batch_size=24,
    )
    assert cfg.distributed.elastic
    with pytest.raises(ValueError) as info:  # 3 ranks is no whole number of replicas
        TrainConfig(
            distributed={"backend": "torch", "ranks": 4, "min_ranks": 3},
            parallel={"stages": 2},
            batch_size=24,
        )
    assert "distributed.min_ranks 3 with parallel.stages 2" in str(info.value)
    assert "multiple of 2" in str(info.value)
    with pytest.raises(ValueError) as info:  # 3 or 1 replica(s) of 4 microbatches: 2 no
        TrainConfig(
            distributed={"backend": "torch", "ranks": 6, "min_ranks": 2},
            parallel={"stages": 2, "microbatches": 4},
            batch_size=36,
        )
    assert "parallel.microbatches 4 on each of 2 replica(s)" in str(info.value)
    assert "e.g. 48" in str(info.value)  # lcm(4, 8, 12) = 24; the least multiple >= 36


def test_a_pipelines_world_shrinks_by_whole_replicas():
    w = World.of(None, 6, unit=2)
    host = next(iter(w.slots))
    assert w.size == 6
    assert w.lose_slot(host, 0) and w.size == 6  # a first loss: its slot used again
    assert not w.lose_slot(host, 0)  # twice: out; 5 slots left, a world of 2 x 2
    assert w.size == 4


def test_a_pipelines_world_grows_only_by_whole_replicas():
    # 2 stages: hosts b and c (a slot each) are out, 2 ranks run; b alone back would
    # make 3 slots, still one replica: no regrow; b and c back: 4 ranks, 2 replicas
    w = World.of(Hosts(("a:2", "b:1", "c:1")), 4, unit=2)
    w.leave_out("b")
    w.leave_out("c")
    assert w.size == 2
    assert not w.grows_with(["b"]) and w.grows_with(["b", "c"])
    assert not World.of(Hosts(("a:2", "b:1", "c:1")), 4).grows_with([])


def test_the_batch_error_suggests_a_batch_every_world_splits():
    with pytest.raises(ValueError) as info:
        TrainConfig(distributed={"backend": "mpi", "ranks": 4, "min_ranks": 2}, batch_size=64)
    assert "e.g. 72" in str(info.value)  # lcm(2, 3, 4) = 12; the least multiple >= 64


def test_defaults_are_not_elastic():
    d = TrainConfig(backend="mpi", ranks=3).distributed
    assert not d.elastic and d.fewest_ranks == 3 and d.regrow and d.max_world_changes == 4


def test_a_silent_host_is_out_until_it_answers_and_a_host_lost_twice_stays_out():
    w = World.of(Hosts(("a:2", "b:1")), 3)
    assert w.slots == {"a": 2, "b": 1} and w.size == 3
    w.lose_host("b")
    assert w.size == 2 and w.waiting() == ["b"]
    assert w.hosts_for(Hosts(("a:2", "b:1"))).entries == ("a:2",)
    w.take_back("b")
    assert w.size == 3
    w.lose_host("b")  # its second loss: flapping
    assert w.size == 2 and w.waiting() == [] and w.banned == {"b"}


def test_a_slot_on_a_host_that_answers_is_used_again_once_then_left_out_for_the_try():
    w = World.of(Hosts(("a:2", "b:1")), 3)
    assert w.lose_slot("a", 1) is True and w.size == 3  # relaunched in place
    assert w.lose_slot("a", 0) is True and w.size == 3  # another slot: its first loss
    assert w.lose_slot("a", 1) is False and w.size == 2  # the same slot again: out
    assert w.waiting() == []  # "a" never stopped answering: nothing to take back
    assert w.hosts_for(Hosts(("a:2", "b:1"))).entries == ("a:1", "b:1")
    w.lose_host("a")
    w.take_back("a")  # back after it stopped answering: still without the dropped slot
    assert w.size == 2


def test_a_world_on_this_host_alone_has_its_ranks_as_slots():
    w = World.of(None, 3)
    assert w.lose_slot(socket.gethostname(), 2) is True and w.size == 3
    assert w.lose_slot(socket.gethostname(), 2) is False
    assert w.size == 2 and w.hosts_for(None) is None


def test_only_lost_ranks_are_losses():
    assert is_loss(RankFailure(1, None, "SIGKILL", []))
    assert is_loss(RankFailure(2, None, None, [], how="was lost with its host: gone"))
    assert is_loss(
        RankFailure(0, 1, None, [], error_type="TaskError", error_message="Timed out waiting")
    )
    assert not is_loss(RankFailure(0, 1, None, [], error_type="ValueError", error_message="bug"))
    assert not is_loss(RankInputError(0, 1, None, [], error="InputError: bad data"))


def test_a_world_change_reads_as_one_line():
    line = change_line(
        {
            "change": "shrink",
            "step": 557,
            "from": 3,
            "to": 2,
            "why": "rank 1 was killed by SIGKILL",
            "seconds": 5.28,
            "steps_lost": 1,
        }
    )
    assert line == (
        "world 3 -> 2 ranks at step 557: rank 1 was killed by SIGKILL "
        "(recovered in 5.3 s, 1 step lost)"
    )
    grow = change_line({"change": "grow", "step": 576, "from": 2, "to": 3, "why": "back"})
    assert grow == "world 2 -> 3 ranks at step 576: back"
    restart = change_line(
        {"change": "restart", "step": 40, "from": 3, "to": 3, "why": "w", "steps_lost": 1}
    )
    assert restart == "world of 3 ranks relaunched at step 40: w (1 step lost)"


def _state(step: int, sums: list[float], job: str = "j1", carried=(0.0, 0, 0)) -> dict:
    return {
        "model": {"w": torch.full((2,), float(step))},
        "optim": [],
        "step": step,
        "epochs": "[]",
        "config": "{}",
        "sums": json.dumps(sums),
        "carried": json.dumps(list(carried)),
        "job": job,
    }


def test_the_newest_rescue_wins_and_the_survivors_figures_are_added(tmp_path):
    d = tmp_path / "ckpt"
    checkpoint.save({**_state(40, [9.0, 9, 9]), "sums": "[9.0, 9, 9]"}, d, 40)
    checkpoint.save(_state(57, [1.0, 2, 3], carried=(10.0, 10, 10)), d / "rescue/rank0", 57)
    checkpoint.save(_state(57, [2.0, 3, 4], carried=(10.0, 10, 10)), d / "rescue/rank2", 57)
    checkpoint.save(_state(56, [5.0, 5, 5]), d / "rescue/rank3", 56)  # a step behind
    checkpoint.save(_state(57, [7.0, 7, 7], job="old"), d / "rescue/rank4", 57)  # not this job
    path, state = newest(d)
    assert state["step"] == 57 and "rescue" in str(path)
    assert json.loads(state["sums"]) == [13.0, 15, 17]  # carried + ranks 0 and 2
    assert "job" not in state and "carried" not in state


def test_a_checkpoint_newer_than_every_rescue_wins(tmp_path):
    d = tmp_path / "ckpt"
    checkpoint.save(_state(57, [1.0, 1, 1]), d / "rescue/rank0", 57)
    checkpoint.save({**_state(60, [0.0, 0, 0]), "sums": "[0.0, 0, 0]"}, d, 60)
    path, state = newest(d)
    assert state["step"] == 60 and path.parent == d
