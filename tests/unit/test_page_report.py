"""The training page's report, from artifact files alone (dagtrain.plugins.report)."""

from __future__ import annotations

import json

import pytest

from dagtrain.plugins import report


def make_run(tmp_path, run_id="manual__1"):
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True)
    train = report.run_dir_of(root, run_id) / "train"
    (train / "traces").mkdir(parents=True)
    lines = [
        {"kind": "start", "step": 0, "total_steps": 40, "steps_per_epoch": 20},
        {"kind": "epoch", "epoch": 0, "train_loss": 1.0, "val_accuracy": 0.5},
        {"kind": "start", "step": 20, "resumed_from_step": 20, "steps_per_epoch": 20},
        {"kind": "epoch", "epoch": 1, "train_loss": 0.5, "val_accuracy": 0.8},
    ]
    (train / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kin')
    (train / "config.json").write_text(json.dumps({"training": {"lr": 0.1, "epochs": 2}}))
    (train / "failure-try1.json").write_text(
        json.dumps({"rank": 1, "how": "rank 1 was killed by SIGKILL", "log_tail": ["bye"]})
    )
    for rank in (0, 1):
        ev = [
            {"ph": "X", "name": "forward-backward", "pid": rank, "tid": 0, "ts": 0, "dur": 100},
            {"ph": "X", "name": "allreduce[0]", "pid": rank, "tid": 1, "ts": 50, "dur": 100},
        ]
        (train / "traces" / f"step-rank{rank}.json").write_text(json.dumps({"traceEvents": ev}))
    return root, {"dir": str(root / "data" / "v1"), "version": "v1", "rows": {"train": 9}}


def test_a_report_of_a_run_retried_after_a_killed_rank(tmp_path):
    root, data = make_run(tmp_path)
    assert report.artifact_root(data) == root.resolve()
    r = report.run_report(root, "manual__1", [], {"training": {"lr": 0.05, "epochs": 2}}, data)
    assert [e["epoch"] for e in r["epochs"]] == [0, 1]  # the half-written line is not one
    assert [t["resumed_from_step"] for t in r["tries"]] == [None, 20]
    assert r["config_vs_file"] == [{"field": "training.lr", "run": 0.1, "other": 0.05}]
    assert r["ranks"][1]["status"] == "failed" and r["ranks"][1]["last_lines"] == ["bye"]
    assert "SIGKILL" in r["ranks"][1]["how"]
    assert r["sync"]["hidden_share"] == pytest.approx(0.5)  # half the allreduce under backward
    merged = report.merged_trace(root, "manual__1")
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}


def test_nothing_outside_the_artifact_root_is_read(tmp_path):
    root, _ = make_run(tmp_path)
    # a crafted run id cannot leave the runs folder: its path is made of safe characters
    assert report.run_dir_of(root, "../../../etc").parent == (root / "runs").resolve()
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    link = report.run_dir_of(root, "manual__1") / "eval.json"
    link.symlink_to(outside)  # a link out of the root is refused, not followed
    with pytest.raises(ValueError, match="outside the pipeline's artifact root"):
        report.run_report(root, "manual__1", [], None, None)
