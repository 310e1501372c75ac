"""Elastic runs on real ranks (torch.distributed, mpi4py and Horovod under mpirun): a
rank killed or stalled mid-run costs at most the step in flight; its slot (this host
answers) is used again at once by a new process, and the run equals, bit for bit, the
one nobody killed; a slot that loses a rank twice is left out and the run equals what
the smaller world would have trained. Hosts that stop answering and come back are
tests/multihost's. Nothing here is mocked."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest
import torch

from dagtrain.launch import RankFailure
from dagtrain.training import TrainConfig, run_training
from dagtrain.training.rank import checkpoint as ckpt

from .faults import Faults

QUIET = {"on_line": lambda line: None}

# 3 ranks on 2 cores with 10 s (and 3 s) collective deadlines, faults at a step of
# training: beside another test a healthy rank can miss its deadline, so these run alone
pytestmark = pytest.mark.alone


def elastic(tmp: Path, **kw) -> TrainConfig:
    base = {
        "backend": "torch",
        "ranks": 3,
        "min_ranks": 2,
        "epochs": 14,
        "batch_size": 30,
        "bucket_mb": 0.01,
        # the registry's MLP, telling a file per rank how many steps it has started
        # (DAGTRAIN_BENCH_STEPS): a fault lands at a step, not at a time that an idle
        # machine may have trained past (mpi's 672 steps can take one second)
        "model": "benchmarks.elastic_model:mlp",
        "model_args": {"hidden": [64]},
        "collective_timeout": 10,
        "checkpoint_every": 0,  # the epochs' ends: a rescue is what saves a mid-epoch step
        "checkpoint_dir": str(tmp / "ckpt"),
        "status_dir": str(tmp / "ranks"),
        "metrics_file": str(tmp / "metrics.jsonl"),
    }
    return TrainConfig(**{**base, **kw})


@pytest.fixture(autouse=True)
def steps_folder(tmp_path, monkeypatch) -> Path:
    """Where each rank says how many steps it has started (every world's ranks count
    from 0 again)."""
    folder = tmp_path / "steps"
    folder.mkdir()
    monkeypatch.setenv("DAGTRAIN_BENCH_STEPS", str(folder))
    return folder


def final_params(directory: Path) -> dict[str, torch.Tensor]:
    _, state = ckpt.latest(directory)
    return state["model"]


def world_lines(cfg: TrainConfig) -> list[dict]:
    lines = [json.loads(x) for x in Path(cfg.metrics_file).read_text().splitlines()]
    return [m for m in lines if m.get("kind") == "world"]


def test_a_slot_that_loses_a_rank_twice_is_left_out_and_the_run_equals_the_smaller_world(
    tmp_path,
):
    cfg = elastic(tmp_path / "elastic")
    faults = Faults((1, 100, signal.SIGKILL), (1, 100, signal.SIGKILL))
    lines: list[str] = []
    res = run_training(cfg, on_start=faults, on_line=lines.append)
    restart, shrink = res.world_changes
    assert restart["change"] == "restart" and (restart["from"], restart["to"]) == (3, 3)
    assert shrink["change"] == "shrink" and (shrink["from"], shrink["to"]) == (3, 2), shrink
    for change in (restart, shrink):
        assert change["ranks"] == [1] and change["hosts"] == [socket.gethostname()], change
        assert change["steps_lost"] is not None and change["steps_lost"] <= 1, change
        assert change["seconds"] is not None and change["seconds"] > 0, change
    # timed from the kill (the survivors' gloo fails as the connection closes), not from
    # when the launcher noticed
    for change, sent in zip(res.world_changes, faults.sent):
        assert 0 <= change["time"] - sent["time"] < 0.75, (change, sent)
    # both lines reach on_line, as they reach the task's log
    assert any(x.startswith("dagtrain: world of 3 ranks relaunched at step") for x in lines)
    assert any(x.startswith("dagtrain: world 3 -> 2 ranks at step") for x in lines), lines
    assert not any("answers again" in x for x in lines), lines
    per_epoch = 48  # digits: 1437 training samples in batches of 30
    k = shrink["step"]
    assert 0 < restart["step"] < k < res.steps, res.world_changes
    assert res.world == 2 and res.steps == 14 * per_epoch
    assert world_lines(cfg) == res.world_changes
    assert not faults.left()

    # the reference: 3 ranks to step k (the relaunch in place changes nothing), then 2
    # ranks from there, on the same global batch
    ref = elastic(tmp_path / "ref", min_ranks=None, max_steps=k)
    run_training(ref, **QUIET)
    rest = elastic(tmp_path / "ref", min_ranks=None, ranks=2)
    again = run_training(rest, **QUIET)
    assert again.resumed_from_step == k
    got, want = final_params(tmp_path / "elastic" / "ckpt"), final_params(tmp_path / "ref" / "ckpt")
    for name, v in want.items():
        assert torch.allclose(got[name], v, rtol=1e-5, atol=1e-7), name
    # and bit for bit: the same sums in the same order (every rank's threads alike)
    assert res.params_sha256 == again.params_sha256
    # every epoch's figures too; the lost rank's share of its last epoch is gone (up to
    # a third of that epoch's samples: its mean loss is another sample's, 5.3% off once)
    assert len(res.epochs) == len(again.epochs) == 14
    lost_in = {restart["step"] // per_epoch, k // per_epoch}
    for mine, theirs in zip(res.epochs, again.epochs):
        near = 0.25 if mine["epoch"] in lost_in else 1e-4
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=near), mine


@pytest.mark.parametrize("backend", ["torch", "mpi", "horovod"])
def test_every_backend_names_two_ranks_killed_at_once_and_relaunches_them_in_place(
    tmp_path, backend
):
    cfg = elastic(tmp_path, backend=backend)
    faults = Faults(((1, 2), 100, signal.SIGKILL))
    res = run_training(cfg, on_start=faults, **QUIET)
    (change,) = res.world_changes
    assert (change["change"], change["from"], change["to"]) == ("restart", 3, 3), change
    # mpirun and horovodrun name one killed rank: the other is known by its record
    assert sorted(change["ranks"]) == [1, 2], change
    assert change["steps_lost"] <= 1, change
    assert res.world == 3 and res.steps == 14 * 48
    assert len(res.epochs) == 14
    assert world_lines(cfg) == res.world_changes
    assert not faults.left()


def test_a_stalled_rank_is_named_and_relaunched(tmp_path):
    cfg = elastic(tmp_path, collective_timeout=3)
    faults = Faults((2, 100, signal.SIGSTOP))
    res = run_training(cfg, on_start=faults, **QUIET)
    (change,) = res.world_changes
    assert change["ranks"] == [2] and "rank 2 stopped answering" in change["why"], change
    assert change["change"] == "restart" and change["steps_lost"] <= 1, change
    # the loss is its last heartbeat (a record written at most 2 s apart), not the
    # survivors' timeout 3 s later
    assert change["time"] <= faults.sent[0]["time"] + 0.1, (change, faults.sent)
    assert res.world == 3 and res.steps == 14 * 48
    assert not faults.left()


def test_a_loss_past_the_bound_on_world_changes_fails_the_try_saying_why(tmp_path):
    cfg = elastic(tmp_path, min_ranks=1, max_world_changes=1)
    faults = Faults((1, 100, signal.SIGKILL), (1, 100, signal.SIGKILL))
    with pytest.raises(RankFailure) as info:
        run_training(cfg, on_start=faults, **QUIET)
    assert info.value.rank == 1 and info.value.signal == "SIGKILL", str(info.value)
    first = str(info.value).splitlines()[0]
    assert "1 world change(s) made already in this try (distributed.max_world_changes)" in first
    assert faults.worlds == 2  # the second loss ended the try: no third world
    assert len(world_lines(cfg)) == 1
    assert not faults.left()


def test_below_min_ranks_the_try_fails_and_the_retry_resumes_from_the_rescue(tmp_path):
    cfg = elastic(tmp_path)
    # the same slot twice (3 -> 3, then 3 -> 2), then a rank of the two: 1 left
    faults = Faults(*[(1, 100, signal.SIGKILL)] * 3)
    with pytest.raises(RankFailure) as info:
        run_training(cfg, on_start=faults, **QUIET)
    assert info.value.rank == 1 and info.value.signal == "SIGKILL", str(info.value)
    first = str(info.value).splitlines()[0]
    assert "fewer than distributed.min_ranks 2: the try fails" in first, first
    changes = world_lines(cfg)  # the loss that left 1 rank fails the try
    assert [c["change"] for c in changes] == ["restart", "shrink"], changes
    shrink = changes[1]
    assert faults.worlds == 3 and not faults.left()
    # Airflow's retry: a new try, on every slot again, from the last completed step
    retry = run_training(cfg, **QUIET)
    assert retry.resumed_from_step is not None and retry.resumed_from_step > shrink["step"]
    assert retry.world == 3 and retry.steps == 14 * 48 and not retry.world_changes
