"""The training page's view of a pipeline-parallel run: each stage rank's stage and
replica, its bubble measured from its step trace, the result's pipeline summary; and a
data-parallel run without any of it."""

from __future__ import annotations

import json

import pytest

from dagtrain.plugins import report
from dagtrain.records.layout import ArtifactLayout

from .pipeline_fixture import DAG, make_pipeline_run
from .test_page_report import make_run


def _x(name, ts, dur, pid=0, tid=0):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def test_a_ranks_bubble_is_the_share_of_its_step_without_forward_backward_or_weights():
    ev = [
        _x("recv-act0", 0, 100, tid=1),  # the step's span begins with its first op
        _x("F0", 100, 200),
        _x("F1", 300, 200),
        _x("B0", 600, 300),
        _x("W0", 900, 100),
        _x("send-grad0", 900, 50, tid=1),  # communication is not compute
        _x("update", 1000, 100),  # nor is the update, which the span ends with
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "caller"}},
    ]
    b = report.bubble_of(ev)
    assert b["span_ms"] == pytest.approx(1.1) and b["busy_ms"] == pytest.approx(0.8)
    assert b["bubble"] == pytest.approx(1 - 800 / 1100)
    # ops that overlap (two threads) are counted once, so no rank is busier than its span
    assert report.bubble_of([_x("F0", 0, 100), _x("W1", 50, 100, tid=1)])["bubble"] == 0.0
    # with chunks (F3.1: microbatch 3 through the rank's chunk 1) an op is compute too
    chunked = [_x("F0.1", 0, 100), _x("recv-act1.1", 100, 100), _x("B0.1", 200, 100)]
    assert report.bubble_of(chunked)["bubble"] == pytest.approx(1 / 3)
    # a data-parallel step has no microbatch ops: no bubble
    assert report.bubble_of([_x("forward-backward", 0, 100)]) is None
    assert report.bubble_of([_x("Foo", 0, 100), _x("B", 0, 10), _x("F1x", 0, 1)]) is None


@pytest.mark.parametrize("order", ["1f1b", "gpipe", "zero-bubble"])
def test_a_pipelined_report_has_each_ranks_stage_replica_and_bubble(tmp_path, order):
    root, data = make_pipeline_run(tmp_path, stages=2, replicas=2, microbatches=4, order=order)
    stages = [{"task_id": "train", "state": "success", "map_index": -1, "try_number": 1}]
    r = report.run_report(root, DAG, "manual__pp", stages, None, data)
    # the ranks table: each rank's stage and replica, from its record
    assert [(k["rank"], k["stage"], k["replica"]) for k in r["ranks"]] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    p = r["pipeline"]
    assert (p["stages"], p["replicas"], p["microbatches"], p["order"]) == (2, 2, 4, order)
    assert p["split"] == [3] and p["peak_activation_bytes"] == 3 << 20
    assert p["reference_bubble"] == pytest.approx((2 - 1) / (4 + 2 - 1))
    # a bubble per stage rank, from its own trace, and their mean
    by = {x["rank"]: x for x in p["ranks"]}
    assert sorted(by) == [0, 1, 2, 3] and by[1]["stage"] == 1 and by[2]["replica"] == 1
    for x in p["ranks"]:
        assert 0 < x["bubble"] < 1 and x["busy_ms"] < x["span_ms"]
    assert p["mean_bubble"] == pytest.approx(sum(x["bubble"] for x in p["ranks"]) / 4)
    # measured as defined: 1 - (F/B/W time) / (the rank's step span), from the file
    trace = ArtifactLayout(root, DAG).run("manual__pp").train.trace_files()[None][1]
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    busy = sum(e["dur"] for e in spans if e["name"][0] in "FBW" and e["name"][1:].isdigit())
    span = max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
    assert by[1]["bubble"] == pytest.approx(1 - busy / span)
    # a pipeline's backward is its B and W ops: the allreduce after them is not hidden
    assert r["sync"]["hidden_share"] == 0.0


def test_while_a_pipelined_run_trains_its_stages_come_from_the_rank_records(tmp_path):
    root, data = make_pipeline_run(tmp_path, with_result=False)  # no result.json yet
    stages = [{"task_id": "train", "state": "running", "map_index": -1, "try_number": 1}]
    r = report.run_report(root, DAG, "manual__pp", stages, None, data)
    assert [k["stage"] for k in r["ranks"]] == [0, 1]
    p = r["pipeline"]
    assert p["stages"] == 2 and p["order"] is None
    assert p["reference_bubble"] is None  # the formula needs the order the result says
    assert all(x["bubble"] is not None for x in p["ranks"])


def test_the_merged_trace_names_each_process_by_its_stage_and_carries_its_bubbles(tmp_path):
    root, _ = make_pipeline_run(tmp_path, steps=(None, 20))
    for step in (None, 20):
        merged = report.merged_trace(root, DAG, "manual__pp", step)
        names = {
            e["pid"]: e["args"]["name"]
            for e in merged["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"
        }
        assert names == {0: "rank 0 · stage 0", 1: "rank 1 · stage 1"}
        p = merged["otherData"]["pipeline"]
        assert [(x["rank"], x["stage"]) for x in p["ranks"]] == [(0, 0), (1, 1)]
        assert all(0 < x["bubble"] < 1 for x in p["ranks"]) and p["mean_bubble"] > 0
        ops = {e["name"] for e in merged["traceEvents"] if e["ph"] == "X"}
        assert {"F0", "B3", "send-act0", "recv-grad0", "update", "load-next"} <= ops
        # each op's kind and microbatch in its args, read from its name by the server
        args = {e["name"]: e["args"] for e in merged["traceEvents"] if e["ph"] == "X"}
        assert args["F0"]["op"] == "F" and args["B3"]["microbatch"] == 3
        recv = args["recv-grad0"]
        assert (recv["op"], recv["microbatch"], recv["way"], recv["carries"]) == (
            "recv-grad",
            0,
            "recv",
            "grad",
        )
        assert "op" not in args["update"] and "op" not in args["load-next"]
        assert "index" in args["F0"]  # the rank's own args kept


def test_a_data_parallel_run_has_no_pipeline_stage_or_replica(tmp_path):
    root, data = make_run(tmp_path)
    r = report.run_report(root, DAG, "manual__1", [], None, data)
    assert r["pipeline"] is None
    assert all(k["stage"] is None and k["replica"] is None for k in r["ranks"])
    merged = report.merged_trace(root, DAG, "manual__1")
    assert "otherData" not in merged
    assert not [e for e in merged["traceEvents"] if "op" in e.get("args", {})]
    assert not [e for e in merged["traceEvents"] if e.get("name") == "process_name"]
    # a record written before pipelines, or with stage None, is data-parallel too
    ranks = report.run_dir_of(root, DAG, "manual__1") / "train" / "ranks"
    ranks.mkdir()
    (ranks / "rank0.json").write_text(json.dumps({"rank": 0, "stage": None, "replica": None}))
    assert report.run_report(root, DAG, "manual__1", [], None, data)["pipeline"] is None


def test_a_pipeline_of_one_replica_a_stage_says_it_has_no_gradient_sync_and_why(tmp_path):
    root, data = make_pipeline_run(tmp_path, stages=2, replicas=1, microbatches=4, order="1f1b")
    stages = [{"task_id": "train", "state": "success", "map_index": -1, "try_number": 1}]
    r = report.run_report(root, DAG, "manual__pp", stages, None, data)
    assert r["sync"]["none"].startswith("no gradient sync: each of the 2 pipeline stages")
    two = report.run_report(
        *make_pipeline_run(tmp_path / "b", stages=2, replicas=2, microbatches=4, order="1f1b")[:1],
        DAG,
        "manual__pp",
        stages,
        None,
        data,
    )
    assert two["sync"]["none"] is None  # replicas average their stage's gradients
