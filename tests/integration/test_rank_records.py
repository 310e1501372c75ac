"""Ranks report through files: each rank's status record (``dagtrain.rank_env``) says
where it runs, what step it is at and, before it exits on an error, why; the launcher
names the failure from it. A rank killed before it can write one is known from its
exit status and the launcher's words. Real ranks in real processes, one per launcher.

On one host the RankFailure's ``host`` is the host the rank's record gives (this
machine's name), but the message names no host: it does so for jobs on several hosts.
"""

from __future__ import annotations

import json
import socket

import pytest

from dagtrain.errors import InputError
from dagtrain.launch import RankFailure, RankInputError
from dagtrain.training import TrainConfig, run_training

QUIET = {"on_line": lambda line: None}
LAUNCHERS = [("mpi", "mpirun"), ("torch", "torchrun"), ("torch", "direct")]
STEP = 3  # the step (counted from 0) rank 1 fails in


def _failing(backend: str, how: str, step: int = STEP, **kw) -> TrainConfig:
    return TrainConfig(
        backend=backend,
        model="tests.unit.training.factory:fail_at_step",
        model_args={"rank": 1, "step": step, "how": how},
        epochs=1,
        max_steps=20,
        batch_size=32,
        bucket_mb=0.01,
        collective_timeout=20,
        **kw,
    )


@pytest.mark.parametrize(("backend", "launcher"), LAUNCHERS)
def test_a_rank_that_raises_a_project_error_is_named_from_its_record(backend, launcher):
    with pytest.raises(RankFailure) as info:
        run_training(_failing(backend, "raise"), 2, launcher=launcher, timeout=90, **QUIET)
    err = info.value
    assert isinstance(err, RankInputError) and isinstance(err, InputError), repr(err)
    # what the record says: the rank, its host, its error's type and message, its step
    assert err.rank == 1, str(err)
    assert err.host == socket.gethostname(), err.to_dict()
    assert err.error_type == "InputError", err.to_dict()
    assert err.error_message == f"rank 1 met a bad batch at step {STEP}", err.to_dict()
    assert err.step == STEP, err.to_dict()
    assert err.role == "train" and err.signal is None
    assert "InputError: rank 1 met a bad batch" in (err.traceback or ""), err.traceback
    assert str(err).startswith("rank 1 refused its input: InputError: rank 1 met a bad batch")
    doc = err.to_dict()
    json.dumps(doc)  # JSON as it is
    assert {"rank", "host", "how", "error", "log_tail", "last_lines", "summary"} <= set(doc)
    assert doc["bad_input"] is True and doc["error"] == err.error


@pytest.mark.parametrize(("backend", "launcher"), LAUNCHERS)
def test_a_rank_sigkilled_before_it_writes_a_record_is_named_by_its_signal(backend, launcher):
    with pytest.raises(RankFailure) as info:
        run_training(_failing(backend, "sigkill"), 2, launcher=launcher, timeout=90, **QUIET)
    err = info.value
    assert not isinstance(err, InputError), repr(err)
    assert err.rank == 1 and err.signal == "SIGKILL", str(err)
    assert err.exit_code is None and err.error is None and err.error_type is None, err.to_dict()
    assert str(err).startswith("rank 1 was killed by SIGKILL"), str(err)
    # the step is the last one its record was written at (it never recorded a failure)
    assert err.step is None or 0 <= err.step <= STEP, err.to_dict()


def test_the_status_record_holds_the_failure_beside_the_live_figures(tmp_path):
    status = tmp_path / "ranks"
    cfg = _failing("mpi", "raise", status_dir=str(status))
    with pytest.raises(RankInputError):
        run_training(cfg, 2, timeout=90, **QUIET)
    one = json.loads((status / "rank1.json").read_text())
    assert one["rank"] == 1 and one["status"] == "failed" and one["role"] == "train"
    assert one["host"] == socket.gethostname() and isinstance(one["pid"], int)
    assert (one["type"], one["step"], one["fail_fast"]) == ("InputError", STEP, True)
    assert one["ready"] is True and one["total_steps"] == 20 and "samples_per_second" in one
    assert "Traceback" in one["traceback"] and one["time"] > one["started"]
    zero = json.loads((status / "rank0.json").read_text())
    assert zero["job"] == one["job"] and zero["status"] in ("running", "starting")

    # the next job in the same folder reads its own records only: its rank 1 fails at
    # another step, and the error names that one
    again = _failing("mpi", "raise", step=1, status_dir=str(status))
    with pytest.raises(RankInputError) as info:
        run_training(again, 2, timeout=90, **QUIET)
    assert info.value.step == 1, info.value.to_dict()
    newer = json.loads((status / "rank1.json").read_text())
    assert newer["job"] != one["job"] and newer["step"] == 1
