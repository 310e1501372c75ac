"""A rank's status record (dagtrain.rank_env): one file per rank, every write whole and
merged with the ones before, a failure's fields beside the live ones; the launcher
reads its own job's records only."""

from __future__ import annotations

import json
import os
import socket

import pytest

from dagtrain import rank_env
from dagtrain.errors import InputError
from dagtrain.launch.diagnose import RankFailure, RankInputError, diagnose
from dagtrain.launch.supervise import Ending, Job
from dagtrain.rank_env import (
    JOB_ID,
    STATUS_DIR,
    StatusRecord,
    mark_ready,
    report_failure,
    start_rank,
)
from dagtrain.records.status import RankRecord, read_records


@pytest.fixture
def rank1(tmp_path, monkeypatch):
    """This process as rank 1 of job ``j1``, its records in ``tmp_path``."""
    monkeypatch.setenv(STATUS_DIR, str(tmp_path))
    monkeypatch.setenv(JOB_ID, "j1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(rank_env, "_this", None)
    return tmp_path


def _read(folder, rank=1):
    return json.loads((folder / f"rank{rank}.json").read_text())


def test_a_rank_starts_becomes_ready_runs_and_fails_in_one_record(rank1):
    from dagtrain.training.rank.progress import RankStatus

    start_rank("train")
    doc = _read(rank1)
    assert doc["rank"] == 1 and doc["job"] == "j1" and doc["role"] == "train"
    assert doc["host"] == socket.gethostname() and doc["pid"] == os.getpid()
    assert doc["status"] == "starting" and doc["ready"] is False and doc["step"] is None
    mark_ready()
    assert _read(rank1)["ready"] is True
    status = RankStatus(str(rank1), 1, every=3600)  # the launcher's folder: one file
    assert status.path == rank1 / "rank1.json" and len(status.records) == 1
    status.start(0, 10)
    for _ in range(4):
        status.step(0.01, 32)
    assert _read(rank1)["step"] == 0  # in memory until the next write
    try:
        raise RuntimeError("boom") from InputError("model.args: bad")
    except RuntimeError as e:
        report_failure("1", e)
    doc = _read(rank1)
    assert doc["status"] == "failed" and doc["step"] == 4 and doc["ready"] is True
    # the cause that no retry mends is the one reported
    assert (doc["type"], doc["message"], doc["fail_fast"]) == (
        "InputError",
        "model.args: bad",
        True,
    )
    assert "RuntimeError: boom" in doc["traceback"] and doc["total_steps"] == 10
    status.flush()  # the figures of a thread still running do not undo the failure
    assert _read(rank1)["status"] == "failed"
    assert [r.rank for r in read_records(rank1, "j1").values() if r.failed] == [1]


def test_figures_for_another_folder_go_there_too(rank1, tmp_path_factory):
    from dagtrain.training.rank.progress import RankStatus

    start_rank("train")
    page = tmp_path_factory.mktemp("page")
    status = RankStatus(str(page), 1, every=3600)
    status.start(2, 10)
    status.step(0.01, 32)
    status.done()
    assert _read(page)["status"] == "done" and _read(page)["step"] == 3
    assert _read(rank1)["status"] == "done" and _read(rank1)["job"] == "j1"


def test_without_a_status_folder_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(STATUS_DIR, raising=False)
    monkeypatch.setattr(rank_env, "_this", None)
    record = start_rank("train", rank=0)
    assert record.path is None
    report_failure(0, ValueError("x"))  # no file, no error
    assert record.fields["status"] == "failed" and not list(tmp_path.iterdir())


def test_a_record_is_typed_where_it_is_written_and_where_it_is_read(tmp_path):
    # the writer refuses a field the record does not declare (a typo is a bug, not
    # a key nobody reads); the reader ignores one a newer version wrote, and skips a
    # document that is not a record
    record = StatusRecord(tmp_path / "rank3.json", rank=3)
    with pytest.raises(TypeError, match="samples_per_sec"):
        record.write(samples_per_sec=1.0)
    record.write(status="running", step=5, stage=1)
    got = read_records(tmp_path)[3]
    assert (got.rank, got.status, got.step, got.stage, got.ready) == (3, "running", 5, 1, False)
    assert RankRecord.of({"rank": 4, "from_the_future": 1}) == RankRecord(4)
    assert RankRecord.of({"rank": "4"}) is None and RankRecord.of([4]) is None
    failed = RankRecord(2, status="failed", type="ValueError", message="bad")
    assert failed.error == "ValueError: bad" and failed.answered and not RankRecord(1).answered


def test_the_launcher_reads_its_own_jobs_records_only(tmp_path):
    def put(rank, **rec):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **rec}))

    put(0, job="old", status="failed", type="ValueError", message="old", time=1.0)
    put(1, job="new", status="running", host="h1", ready=True, step=7)
    (tmp_path / "rank2.json").write_text("{half")
    assert set(read_records(tmp_path)) == {0, 1}
    assert set(read_records(tmp_path, "new")) == {1}
    assert not any(r.failed for r in read_records(tmp_path, "new").values())

    job = Job(direct=True, nprocs=2, status_dir=tmp_path, job_id="new")
    job.refresh()
    assert job.placement == {1: "h1"} and job.ready == {1}


def _failed_job(tmp_path, records, nprocs=2) -> Job:
    for rec in records:
        (tmp_path / f"rank{rec['rank']}.json").write_text(json.dumps({"job": "j", **rec}))
    job = Job(direct=False, nprocs=nprocs, status_dir=tmp_path, job_id="j")
    job.refresh()
    return job


def test_the_earliest_recorded_failure_is_the_cause_and_fail_fast_is_bad_input(tmp_path):
    records = [
        {"rank": 0, "status": "failed", "type": "RuntimeError", "message": "peer gone", "time": 5},
        {
            "rank": 1,
            "status": "failed",
            "type": "InputError",
            "message": "bad",
            "time": 2,
            "fail_fast": True,
            "step": 9,
            "host": "h",
        },
    ]
    err = diagnose(_failed_job(tmp_path, records), Ending([(0, 1)], [1]))
    assert isinstance(err, RankInputError) and err.rank == 1 and err.step == 9
    assert str(err).startswith("rank 1 refused its input: InputError: bad")
    assert err.host == "h" and "on host" not in str(err)  # one host: not in the message


@pytest.mark.parametrize(
    "followed",
    [
        "HorovodInternalError: Horovod has been shut down. This was caused by an exception"
        " on one of the ranks",
        "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234",
        "CollectiveTimeout: rank 0: broadcast did not finish within 5 s",
    ],
)
def test_a_rank_failing_because_of_a_peer_is_not_the_cause_even_when_recorded_first(
    tmp_path, followed
):
    # a loaded machine can write the peer's record first (horovodrun, seen under xdist)
    kind, _, message = followed.partition(": ")
    records = [
        {"rank": 0, "status": "failed", "type": kind, "message": message, "time": 1},
        {"rank": 1, "status": "failed", "type": "RuntimeError", "message": "boom", "time": 2},
    ]
    err = diagnose(_failed_job(tmp_path, records), Ending([(0, 1)], [1]))
    assert err.rank == 1 and err.error == "RuntimeError: boom", str(err)


def test_a_rank_that_never_got_ready_is_named_when_another_gave_up_waiting(tmp_path):
    records = [
        {
            "rank": 0,
            "status": "failed",
            "ready": True,
            "type": "CollectiveTimeout",
            "message": "rank 0: broadcast did not finish within 5 s",
            "time": 3,
        },
        {"rank": 1, "status": "starting", "ready": False},
    ]
    err = diagnose(_failed_job(tmp_path, records), Ending([(0, 70)], [70]))
    assert err.rank == 1 and "never reached its first collective" in str(err)
    assert "rank 0 gave up waiting for it" in str(err)


def test_rank_failure_fields_and_dict():
    err = RankFailure(2, None, "SIGKILL", ["a", "b"], host="h", step=4, host_in_message=False)
    assert (err.rank, err.host, err.signal, err.step, err.exit_code) == (2, "h", "SIGKILL", 4, None)
    assert err.how == "was killed by SIGKILL" and err.log_tail == err.last_lines == ["a", "b"]
    doc = json.loads(json.dumps(err.to_dict()))
    assert doc["summary"] == "rank 2 was killed by SIGKILL" and doc["bad_input"] is False
    assert doc["log_tail"] == ["a", "b"] and doc["host"] == "h" and doc["error"] is None
    assert str(RankFailure(1, 1, None, [], host="b")).startswith("rank 1 on host b exited")


def test_a_rank_made_to_stop_says_so_first_and_the_killed_ones_are_named(rank1, monkeypatch):
    # what tells a survivor from a rank that died without a word: its record says it was
    # made to stop, before its stop hooks run (a rescue may take longer than mpirun waits)
    start_rank("train")
    seen = []
    monkeypatch.setattr(rank_env, "_stop_hooks", [lambda why: seen.append(_read(rank1))])
    rank_env.stopping("the launcher stopped this rank (SIGTERM)")
    (before_hook,) = seen
    assert before_hook["stopping"] == "the launcher stopped this rank (SIGTERM)"
    assert before_hook["stopping_at"] >= before_hook["started"]
    # the direct launcher's exit statuses, read before it stopped the others: every rank
    # killed by a signal but SIGTERM (its own stop) is lost with the one named
    job = Job(nprocs=4, direct=True)
    codes = [143, -9, -9, 1]
    job.procs = [type("P", (), {"poll": lambda self, c=c: c})() for c in codes]
    err = diagnose(job, Ending([(1, -9), (2, -9)], codes))
    assert err.rank == 1 and err.lost_with == [2] and err.to_dict()["lost_with"] == [2]
