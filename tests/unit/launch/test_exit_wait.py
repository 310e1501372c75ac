"""A job whose every rank said it is done succeeds even when one never exits: it is
stopped after EXIT_WAIT seconds, and nothing is left."""

from __future__ import annotations

import psutil

from dagtrain.launch import launch, supervise
from dagtrain.records.status import RankRecord


def test_a_rank_that_never_exits_after_it_is_done_is_stopped_and_the_job_succeeds(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(supervise, "EXIT_WAIT", 1.0)
    jobs = []
    # timeout: without the rule, the job would be killed and TimeoutError raised
    job = launch(
        ["tests.unit.launch.done_then_hang"],
        2,
        "direct",
        on_line=lambda line: None,
        status_dir=tmp_path,
        on_start=jobs.append,
        timeout=60,
        grace=1.0,
    )
    assert job.done() and job.procs[0].poll() == 0 and job.procs[1].poll() != 0
    assert not any(psutil.pid_exists(p.pid) and p.poll() is None for p in job.procs)


def test_a_job_not_done_is_not_stopped_early(tmp_path, monkeypatch):
    # the rule needs every rank's record: one that never wrote "done" keeps the job running
    monkeypatch.setattr(supervise, "EXIT_WAIT", 0.5)
    job = supervise.Job(nprocs=2, status_dir=tmp_path, job_id="j")
    job.records = {0: RankRecord(0, status="done")}
    assert not job.done()
    job.records = {0: RankRecord(0, status="done"), 1: RankRecord(1, status="running")}
    assert not job.done()
    job.records = {0: RankRecord(0, status="done"), 1: RankRecord(1, status="done")}
    assert job.done()
