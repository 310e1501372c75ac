"""An elastic run's decisions on a loss, without ranks: ``run_elastic`` driven by a
launcher that fails its worlds as real ones do (a RankFailure as ``diagnose`` makes it,
the ranks' status records as they leave them). Every rank lost at once is named; a
slot on a host that answers is used again at once, once; the loss is timed from the
rank's end; a try that gives up says why in its first sentence."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dagtrain.config import TrainConfig
from dagtrain.launch import Job, RankFailure
from dagtrain.launch.diagnose import diagnose
from dagtrain.launch.supervise import Ending
from dagtrain.rank_env import record_path
from dagtrain.training.driver.elastic import run_elastic

HOST = socket.gethostname()


def config(tmp: Path, **dist: Any) -> TrainConfig:
    base = {"backend": "torch", "ranks": 3, "min_ranks": 2, "batch_size": 30, "regrow": True}
    return TrainConfig(**{**base, **dist, "checkpoint_dir": str(tmp / "ckpt")})


class World:
    """One launch: ``killed`` ranks died without a word (SIGKILL), the others were made
    to stop (their records say ``stopping``, at ``t0 + stop_after``); ``fail`` is the
    RankFailure the launcher raised (None: the world trains to the end)."""

    def __init__(self, killed=(), stop_after=0.2, stalled=None, names_one=False, closed=None):
        self.killed, self.stop_after, self.stalled = list(killed), stop_after, stalled
        self.names_one = names_one  # the launcher names one killed rank (mpirun)
        # with ``stalled``: this rank failed first, its connection to the rank that gave
        # up closed (gloo's "Connection closed by peer"), and the launcher names it
        self.closed = closed


class Launcher:
    def __init__(self, tmp: Path, *worlds: World) -> None:
        self.tmp, self.worlds, self.sizes = tmp, list(worlds), []
        self.deaths: list[float] = []

    def __call__(self, cfg: TrainConfig, hosts, started) -> Any:
        n = cfg.world or cfg.distributed.ranks
        self.sizes.append(n)
        k = len(self.sizes)
        status = self.tmp / f"ranks{k}"
        status.mkdir()
        job = Job(nprocs=n, direct=True, status_dir=status, job_id=f"j{k}")
        t0 = time.time() - 5.0  # the world began a while ago: its records are of then
        plan = self.worlds.pop(0) if self.worlds else World()
        for r in range(n):
            rec = {"rank": r, "job": job.job_id, "ready": True, "status": "running", "step": 10}
            rec |= {"updated": t0, "start_step": 10 * (k - 1), "first_step_time": t0 + 1}
            if plan.stalled == r:
                rec["updated"] = t0 - 3.0  # its last heartbeat
            elif r not in plan.killed and (plan.killed or plan.stalled is not None):
                rec |= {"stopping": "SIGTERM", "stopping_at": t0 + plan.stop_after}
            record_path(status, r).write_text(json.dumps(rec))
        job.refresh()
        started(job)
        if not plan.killed and plan.stalled is None:
            return SimpleNamespace(stopped_for=None, steps=100, world_changes=[])
        self.deaths.append(t0)
        job.failed_at = t0 + 1.0  # the launcher saw it a second later
        codes = [-9 if r in plan.killed else (1 if r == 0 else None) for r in range(n)]
        if plan.stalled is not None:
            job.direct = False
            e = RankFailure(
                0,
                1,
                None,
                [],
                error_type="CollectiveTimeout",
                error_message="allreduce did not finish within 3 s",
            )
            rec0 = json.loads(record_path(status, 0).read_text())
            rec0 |= {
                "status": "failed",
                "type": "CollectiveTimeout",
                "time": t0 + 3,
                "message": "allreduce did not finish within 3 s",
            }
            rec0.pop("stopping", None)
            rec0.pop("stopping_at", None)
            record_path(status, 0).write_text(json.dumps(rec0))
            if plan.closed is not None:
                closed = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
                rec = json.loads(record_path(status, plan.closed).read_text())
                rec |= {"status": "failed", "type": "RuntimeError", "time": t0 + 2.9}
                rec |= {"message": closed}
                record_path(status, plan.closed).write_text(json.dumps(rec))
                e = RankFailure(
                    plan.closed, 1, None, [], error_type="RuntimeError", error_message=closed
                )
            job.refresh()
            raise e
        job.procs = [SimpleNamespace(poll=lambda c=c: c) for c in codes]
        e = diagnose(job, Ending([(r, -9) for r in plan.killed], codes))
        if plan.names_one:
            e.lost_with = []
        raise e


def run(tmp: Path, cfg: TrainConfig, launcher: Launcher):
    changes: list[dict] = []
    lines: list[str] = []
    res = run_elastic(cfg, None, launcher, tmp, changes.append, lines.append)
    return res, changes, lines


def test_two_ranks_killed_at_once_are_both_named_and_their_slots_used_again(tmp_path):
    launcher = Launcher(tmp_path, World(killed=[1, 2]))
    res, changes, lines = run(tmp_path, config(tmp_path), launcher)
    (change,) = res.world_changes
    assert change["change"] == "restart" and (change["from"], change["to"]) == (3, 3)
    assert change["ranks"] == [1, 2] and change["hosts"] == [HOST], change
    assert change["why"] == "rank 1 was killed by SIGKILL, and rank 2 with it"
    assert launcher.sizes == [3, 3]  # one relaunch, on the same slots
    assert any("their slots used again; going on with 3 of 3 rank(s)" in x for x in lines), lines
    assert changes == res.world_changes


def test_a_slot_that_loses_a_rank_twice_is_left_out_and_never_said_to_answer_again(tmp_path):
    launcher = Launcher(tmp_path, World(killed=[1]), World(killed=[1]))
    res, _, lines = run(tmp_path, config(tmp_path), launcher)
    kinds = [(c["change"], c["from"], c["to"], c["ranks"]) for c in res.world_changes]
    assert kinds == [("restart", 3, 3, [1]), ("shrink", 3, 2, [1])], res.world_changes
    assert launcher.sizes == [3, 3, 2]  # this host answers: nothing comes "back"
    assert not any("answers again" in x for x in lines), lines
    assert any("rank 1's slot, lost twice in this try left out" in x for x in lines), lines


def test_a_rank_that_died_without_a_word_is_named_when_the_launcher_names_one(tmp_path):
    # mpirun names one killed rank; the other is known by its record: it neither
    # failed, finished, was made to stop, nor saved a rescue
    launcher = Launcher(tmp_path, World(killed=[1, 2], names_one=True))
    res, _, _ = run(tmp_path, config(tmp_path), launcher)
    assert res.world_changes[0]["ranks"] == [1, 2]


def test_a_loss_is_timed_from_the_ranks_end_not_from_when_the_launcher_saw_it(tmp_path):
    launcher = Launcher(tmp_path, World(killed=[1], stop_after=0.2))
    res, _, _ = run(tmp_path, config(tmp_path), launcher)
    (change,) = res.world_changes
    # the survivor was made to stop 0.2 s after the launch began; the launcher saw it 1 s
    # after: the loss is the earlier, and the recovery counts from there
    assert change["time"] == pytest.approx(launcher.deaths[0] + 0.2, abs=1e-3)


def test_a_stalled_ranks_loss_is_its_last_heartbeat(tmp_path):
    launcher = Launcher(tmp_path, World(stalled=2))
    res, _, _ = run(tmp_path, config(tmp_path), launcher)
    (change,) = res.world_changes
    assert change["ranks"] == [2] and "rank 2 stopped answering" in change["why"], change
    assert change["time"] == pytest.approx(launcher.deaths[0] - 3.0, abs=1e-3)


def test_a_stalled_rank_is_named_when_a_survivor_saw_the_one_that_gave_up_leave(tmp_path):
    # rank 0 gave up waiting for rank 2 and left; rank 1, waiting on rank 0, saw its
    # connection close before its own deadline, and its record is the earliest
    launcher = Launcher(tmp_path, World(stalled=2, closed=1))
    res, _, _ = run(tmp_path, config(tmp_path), launcher)
    (change,) = res.world_changes
    assert change["ranks"] == [2] and "rank 2 stopped answering" in change["why"], change
    assert change["time"] == pytest.approx(launcher.deaths[0] - 3.0, abs=1e-3)


def test_the_bound_on_world_changes_is_said_in_the_failures_first_line(tmp_path):
    launcher = Launcher(tmp_path, World(killed=[1]))
    with pytest.raises(RankFailure) as info:
        run(tmp_path, config(tmp_path, max_world_changes=0), launcher)
    first = str(info.value).splitlines()[0]
    assert first.startswith("rank 1 was killed by SIGKILL; 0 world change(s) made already")
    assert "(distributed.max_world_changes): the try fails" in first, first
    assert info.value.summary in first


def test_below_min_ranks_the_failures_first_line_says_so(tmp_path):
    worlds = [World(killed=[1]), World(killed=[1]), World(killed=[1])]
    launcher = Launcher(tmp_path, *worlds)
    with pytest.raises(RankFailure) as info:
        run(tmp_path, config(tmp_path), launcher)
    assert launcher.sizes == [3, 3, 2]
    first = str(info.value).splitlines()[0]
    assert "1 rank(s) left, fewer than distributed.min_ranks 2: the try fails" in first, first


CLOSED = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
TIMEOUT = "allreduce did not finish within 3 s"


@pytest.mark.parametrize(
    ("errors", "named"),
    [
        ({0: TIMEOUT, 1: CLOSED}, 2),  # one gave up, the other saw it leave
        ({0: TIMEOUT, 1: TIMEOUT}, 2),
        ({0: CLOSED, 1: CLOSED}, None),  # nobody waited: a peer died, not stalled
        ({0: TIMEOUT, 1: "ValueError: bad batch"}, None),  # a rank's own error
    ],
)
def test_a_stall_is_read_from_the_survivors_errors(tmp_path, errors, named):
    from dagtrain.launch.diagnose import stalled_rank

    job = Job(nprocs=3, direct=False, status_dir=tmp_path, job_id="j")
    for r in range(3):
        rec = {"rank": r, "job": "j", "ready": True, "status": "running", "step": 10}
        if r in errors:
            rec |= {"status": "failed", "type": "RuntimeError", "message": errors[r]}
        record_path(tmp_path, r).write_text(json.dumps(rec))
    job.refresh()
    assert stalled_rank(job) == named
