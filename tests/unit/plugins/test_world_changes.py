"""An elastic run on the training page's report: each try's world changes (its metrics'
``world`` lines), the ranks a shrink lost kept in the ranks table as left, and the
records an earlier world's ranks left behind never shown as running."""

from __future__ import annotations

import json

from dagtrain.changes import change_line
from dagtrain.phases.train import record_try
from dagtrain.plugins import report

from .pipeline_fixture import DAG

RUN = "manual__el"
# what a real 3-rank run wrote when its rank 1 was killed after epoch 4 (27 steps an
# epoch) and the host was taken back at epoch 5's end
SHRINK = {
    "kind": "world",
    "change": "shrink",
    "step": 108,
    "from": 3,
    "to": 2,
    "ranks": [1],
    "hosts": ["h1"],
    "why": "rank 1 was killed by SIGKILL",
    "steps_lost": 1,
    "seconds": 6.037,
    "time": 1796196691.59,
}
GROW = {
    "kind": "world",
    "change": "grow",
    "step": 135,
    "from": 2,
    "to": 3,
    "ranks": [],
    "hosts": ["h1"],
    "why": "host h1 answers again",
    "steps_lost": 0,
    "seconds": 9.549,
    "time": 1796196697.81,
}


def _start(step: int, t: float) -> dict:
    resumed = step or None
    return {
        "kind": "start",
        "step": step,
        "total_steps": 540,
        "steps_per_epoch": 27,
        "resumed_from_step": resumed,
        "time": t,
    }


def _append(path, *lines: dict) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)


def _record(train, rank: int, job: str, started: float, status: str = "done", step=540):
    (train / "ranks").mkdir(exist_ok=True)
    rec = {
        "rank": rank,
        "job": job,
        "host": f"h{rank}",
        "status": status,
        "step": step,
        "total_steps": 540,
        "started": started,
        "updated": started + 1,
        "samples_per_second": 2000.0 + rank,
        "median_step_ms": 6.4,
        "p95_step_ms": 13.8,
    }
    (train / "ranks" / f"rank{rank}.json").write_text(json.dumps(rec))


def make_elastic_run(tmp_path, *, finished: bool = True):
    """A run whose training task's try 1 lost rank 1 at step 108 (3 -> 2 ranks) and took
    its host back at step 135 (2 -> 3): the metrics as the launching side appends them
    (each world line after the new world's start line), every rank's record and step
    trace, and (``finished``) the result. Returns (root, data)."""
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True)
    train = report.run_dir_of(root, DAG, RUN) / "train"
    (train / "traces").mkdir(parents=True)
    m = train / "metrics.jsonl"
    record_try(m, 1)
    epochs = [{"kind": "epoch", "epoch": e, "train_loss": 1 / (e + 1)} for e in range(6)]
    _append(m, _start(0, 10.0), *epochs[:4], _start(108, 17.0), SHRINK, epochs[4])
    _append(m, {"kind": "end", "step": 135, "total_steps": 540}, _start(135, 27.0), GROW)
    _append(m, *epochs[5:])
    for r in range(3):
        _record(train, r, "job3", 26.0 + r / 10)
        ev = [{"ph": "X", "name": "forward-backward", "pid": r, "tid": 0, "ts": 0, "dur": 90}]
        (train / "traces" / f"step-rank{r}.json").write_text(json.dumps({"traceEvents": ev}))
    if finished:
        result = {"world": 3, "steps": 540, "val_accuracy": 0.95, "stopped_for": None}
        result["world_changes"] = [SHRINK, GROW]
        (train / "result.json").write_text(json.dumps(result))
    return root, {"dir": str(root / "data" / "v1"), "version": "v1", "rows": {"train": 9}}


def _stages(state: str, try_number: int = 1) -> list[dict]:
    return [{"task_id": "train", "map_index": -1, "state": state, "try_number": try_number}]


def test_each_try_lists_its_world_changes_after_its_try_line(tmp_path):
    root, _ = make_elastic_run(tmp_path)
    train = report.run_dir_of(root, DAG, RUN) / "train"
    # try 2: resumed at 540, lost a rank on h2 at once and did not get it back
    record_try(train / "metrics.jsonl", 2)
    lost = SHRINK | {"step": 540, "ranks": [2], "hosts": ["h2"], "seconds": None}
    lost["why"] = "rank 2 was lost with its host h2"
    _append(train / "metrics.jsonl", _start(540, 40.0), _start(540, 48.0), lost)
    r = report.run_report(root, DAG, RUN, _stages("running", 2), None, None)
    one, two = r["tries"]
    assert [(c["change"], c["step"], c["from"], c["to"]) for c in one["world_changes"]] == [
        ("shrink", 108, 3, 2),
        ("grow", 135, 2, 3),
    ]
    shrink = one["world_changes"][0]
    assert shrink["ranks"] == [1] and shrink["hosts"] == ["h1"] and shrink["try"] == 1
    assert shrink["seconds"] == 6.037 and shrink["steps_lost"] == 1
    assert shrink["why"] == "rank 1 was killed by SIGKILL"
    assert shrink["line"] == change_line(SHRINK)  # the CLI's and the task log's sentence
    assert [(c["try"], c["step"], c["seconds"]) for c in two["world_changes"]] == [(2, 540, None)]
    # the report's own list: every try's, oldest first
    assert [(c["try"], c["step"]) for c in r["world_changes"]] == [(1, 108), (1, 135), (2, 540)]
    # a try began at its first start line; the others are relaunches on a new world
    assert one["resumed_from_step"] is None and one["epochs_done_before"] == 0
    assert one["time"] == 10.0
    assert two["resumed_from_step"] == 540 and two["epochs_done_before"] == 20


def test_a_run_without_world_lines_has_no_world_changes_and_keeps_its_fields(tmp_path):
    from .test_page_report import make_run

    root, data = make_run(tmp_path)
    r = report.run_report(root, DAG, "manual__1", [], None, data)
    assert r["world_changes"] == [] and all(t["world_changes"] == [] for t in r["tries"])
    assert {"tries", "ranks", "result", "failures", "epochs", "sync", "pipeline"} <= set(r)
    # a file without try lines: each start line is still a try of its own
    assert [t["resumed_from_step"] for t in r["tries"]] == [None, 20]
    assert [k["status"] for k in r["ranks"]] == ["stopped", "failed"]


def test_the_results_world_changes_stand_in_for_missing_world_lines(tmp_path):
    root, _ = make_elastic_run(tmp_path)
    m = report.run_dir_of(root, DAG, RUN) / "train" / "metrics.jsonl"
    kept = [x for x in m.read_text().splitlines() if '"world"' not in x]
    m.write_text("\n".join(kept) + "\n")
    r = report.run_report(root, DAG, RUN, _stages("success"), None, None)
    assert [(c["try"], c["step"]) for c in r["world_changes"]] == [(1, 108), (1, 135)]
    assert r["result"]["world_changes"][0]["why"] == SHRINK["why"]  # passed on as it was


def test_a_rank_a_shrink_lost_stays_in_the_ranks_table_as_left(tmp_path):
    root, _ = make_elastic_run(tmp_path)
    ranks = report.run_report(root, DAG, RUN, _stages("success"), None, None)["ranks"]
    assert [(k["rank"], k["status"]) for k in ranks] == [
        (0, "done"),
        (1, "done"),
        (2, "done"),
        (1, "left"),  # rank 1 of the world of 3 it left, after the world of now
    ]
    left = ranks[-1]
    assert left["left_at_step"] == 108 and left["left_world"] == 3
    assert left["how"] == "rank 1 was killed by SIGKILL" and left["host"] == "h1"
    assert left["back_at_step"] == 135  # its host was taken back there
    assert left["samples_per_second"] is None and not left.get("slowest")
    assert all(k["left_at_step"] is None for k in ranks[:3])


def test_a_host_never_taken_back_has_no_back_step(tmp_path):
    root, _ = make_elastic_run(tmp_path)
    m = report.run_dir_of(root, DAG, RUN) / "train" / "metrics.jsonl"
    m.write_text("".join(x + "\n" for x in m.read_text().splitlines() if '"grow"' not in x))
    ranks = report.run_report(root, DAG, RUN, _stages("success"), None, None)["ranks"]
    assert ranks[-1]["status"] == "left" and ranks[-1]["back_at_step"] is None


def _shrunk_while_running(tmp_path, *, world_line: bool):
    """Try 1 of 3 ranks (job1) lost rank 1; the new world (job2) of 2 ranks runs. Rank 2's
    record is job1's: its process was stopped, and no rank 2 runs now."""
    root, _ = make_elastic_run(tmp_path, finished=False)
    train = report.run_dir_of(root, DAG, RUN) / "train"
    m = train / "metrics.jsonl"
    m.unlink()
    record_try(m, 1)
    _append(m, _start(0, 10.0), _start(108, 17.0), *([SHRINK] if world_line else []))
    _record(train, 2, "job1", 9.0, status="running", step=108)
    for r in (0, 1):
        _record(train, r, "job2", 16.0 + r / 10, status="running", step=120)
    return root


def test_a_record_an_earlier_world_wrote_does_not_show_as_running(tmp_path):
    root = _shrunk_while_running(tmp_path, world_line=True)
    ranks = report.run_report(root, DAG, RUN, _stages("running"), None, None)["ranks"]
    # the world of now is 2 ranks (the last change's); rank 1 of 3 left
    assert [(k["rank"], k["status"], k["left_at_step"]) for k in ranks] == [
        (0, "running", None),
        (1, "running", None),
        (1, "left", 108),
    ]


def test_before_its_world_line_an_earlier_worlds_record_shows_as_stopped(tmp_path):
    # the world line comes once the new world's first step is done; until then the
    # records alone say which world each rank's belongs to
    root = _shrunk_while_running(tmp_path, world_line=False)
    ranks = report.run_report(root, DAG, RUN, _stages("running"), None, None)["ranks"]
    by = {k["rank"]: k for k in ranks}
    assert [k["rank"] for k in ranks] == [0, 1, 2]
    assert by[2]["status"] == "stopped" and by[2]["earlier_world"] is True
    assert by[0]["status"] == "running" and by[0]["earlier_world"] is False
    assert by[1]["status"] == "running"
