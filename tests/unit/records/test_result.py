"""A training try's result, summary and failure record: typed, written and read back
by one function each, a newer writer's extra fields ignored."""

from __future__ import annotations

import json

from dagtrain.launch.diagnose import RankFailure
from dagtrain.records.result import (
    FailureRecord,
    TrainResult,
    TrainSummary,
    read_failure,
    read_summary,
    write_failure,
    write_summary,
)


def test_the_summary_is_the_result_without_step_times_with_what_the_try_did(tmp_path):
    res = TrainResult(
        rank=0,
        world=2,
        backend="torch",
        steps=30,
        epochs=[{"epoch": 0, "val_accuracy": 0.5}, {"epoch": 1, "val_accuracy": 0.75}],
        resumed_from_step=12,
        resumed_epochs=1,
        step_seconds=[0.3, 0.1, 0.2],
    )
    assert TrainResult.from_json(res.to_json()) == res
    summary = TrainSummary.of_result(res, {1: "b", 0: "a"})
    assert summary.median_step_seconds == 0.2 and summary.placement == {"0": "a", "1": "b"}
    assert (summary.epochs_trained_now, summary.steps_trained_now) == (1, 18)
    path = tmp_path / "result.json"
    write_summary(path, summary)
    doc = json.loads(path.read_text())
    assert "step_seconds" not in doc and doc["val_accuracy"] == 0.75
    assert read_summary(path) == summary
    path.write_text(json.dumps(doc | {"from_a_newer_version": 1}))
    assert read_summary(path) == summary
    path.write_text("[1]")
    assert read_summary(path) is None and read_summary(tmp_path / "none.json") is None


def test_a_failure_record_keeps_the_sentence_the_page_shows_and_how_the_rank_ended(tmp_path):
    e = RankFailure(1, None, "SIGKILL", ["last words"], host="b", step=5)
    record = FailureRecord.of_failure(e)
    assert record.how == e.summary and record.ended == "was killed by SIGKILL"
    assert (record.rank, record.signal, record.step, record.last_lines) == (
        1,
        "SIGKILL",
        5,
        ["last words"],
    )
    path = tmp_path / "failure-try1.json"
    write_failure(path, record)
    assert read_failure(path) == record
