"""``dagtrain logs``'s pure parts: a record as a line, an exception as a traceback, the
DAG's order (tests/airflow/test_logs.py runs the command on a real Airflow)."""

from __future__ import annotations

from datetime import UTC, datetime

from dagtrain.cli.logs import TaskTries, _readable, format_record, tries_in_order


def plain(rec) -> list[str]:
    return [t.plain for t in format_record(rec)]


def test_a_record_reads_time_level_logger_event_then_what_the_ui_shows():
    rec = {
        "timestamp": "2026-12-01T21:45:28.142489Z",
        "level": "info",
        "event": "[rank 0] dagtrain rank 0 runs on host vm",
        "logger": "airflow.task.operators.x.Op",
        "filename": "launcher.py",
        "lineno": 443,
        "ti_id": "01a2",
        "try_number": 1,
        "bundle_name": "dags-folder",
        "bundle_version": None,
    }
    assert plain(rec) == [
        "2026-12-01T21:45:28.142Z INFO    Op: "  # an operator's logger: its class
        "[rank 0] dagtrain rank 0 runs on host vm bundle_name=dags-folder"
    ]
    when = datetime(2026, 12, 1, 22, 0, 1, 5000, tzinfo=UTC)
    assert plain({"timestamp": when, "event": "::group::Pre Execute"}) == [
        "2026-12-01T22:00:01.005Z ▸ Pre Execute"
    ]
    assert plain({"timestamp": None, "event": "bare"}) == ["bare"]
    assert plain("a line that was not JSON") == ["a line that was not JSON"]


def test_an_error_record_carries_its_exception_as_python_prints_it():
    frame = {"filename": "/x/launcher.py", "lineno": 711, "name": "launch"}
    rec = {
        "timestamp": "2026-12-01T21:46:45.569886Z",
        "level": "error",
        "event": "Task failed with exception",
        "logger": "task",
        "error_detail": [
            {"exc_type": "RuntimeError", "exc_value": "wrapped", "frames": [], "is_cause": False},
            {
                "exc_type": "RankFailure",
                "exc_value": "rank 1 was killed by SIGKILL; last lines:\n    bye",
                "exc_notes": ["a note"],
                "frames": [frame],
                "is_cause": True,
            },
        ],
    }
    assert plain(rec) == [
        "2026-12-01T21:46:45.569Z ERROR   task: Task failed with exception",
        "    Traceback (most recent call last):",
        '      File "/x/launcher.py", line 711, in launch',
        "    RankFailure: rank 1 was killed by SIGKILL; last lines:",
        "        bye",
        "    a note",
        "",
        "    The above exception was the direct cause of the following exception:",
        "",
        "    RuntimeError: wrapped",
    ]


def test_the_source_details_group_and_group_ends_are_taken_out():
    recs = [
        {"event": "::group::Log message source details"},
        {"event": "/logs/attempt=1.log"},
        {"event": "::endgroup::"},
        {"event": "::group::Pre Execute"},
        {"event": "hello"},
        {"event": "::endgroup::"},
    ]
    shown, sources = _readable(recs)
    assert sources == ["/logs/attempt=1.log"]
    assert [r["event"] for r in shown] == ["::group::Pre Execute", "hello"]


def test_the_dags_order_is_upstream_first_then_by_start():
    down = {
        "prepare_data": ["train", "evaluate"],
        "train": ["evaluate"],
        "evaluate": ["promote"],
        "promote": [],
        "side": [],  # ready at once, started after prepare_data
    }
    tis = [
        TaskTries("promote"),
        TaskTries("evaluate"),
        TaskTries("train", started="2026-01-01T00:00:02"),
        TaskTries("side", started="2026-01-01T00:00:01"),
        TaskTries("gone", started="2026-01-01T00:00:00"),  # no longer in the DAG
        TaskTries("prepare_data", started="2026-01-01T00:00:00"),
        TaskTries("shard", 1),
        TaskTries("shard", 0),
    ]
    down["shard"] = ["promote"]
    order = [t.label for t in tries_in_order(tis, down)]
    assert order == [
        "prepare_data",
        "side",
        "train",
        "evaluate",
        "shard[0]",
        "shard[1]",
        "promote",
        "gone",
    ]
