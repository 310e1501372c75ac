"""The training page's report, from artifact files alone (dagtrain.plugins.report)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dagtrain.phases.train import record_try
from dagtrain.plugins import report
from dagtrain.records import metrics

from .pipeline_fixture import DAG


def make_run(tmp_path, run_id="manual__1"):
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True)
    train = report.run_dir_of(root, DAG, run_id) / "train"
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


def data_asset(root: Path) -> SimpleNamespace:
    """prepare_data's outlet as the serialized DAG holds it (``pipelines.data_asset``)."""
    return SimpleNamespace(name="dagtrain.p.data", uri=(root / "data").as_uri())


def test_the_artifact_root_is_the_dags_data_asset_never_the_xcoms_dir(tmp_path):
    root = tmp_path / "a root with spaces" / "p"
    model = SimpleNamespace(name="dagtrain.p.model", uri=(root / "registry").as_uri())
    assert report.artifact_root([model, data_asset(root)]) == root.resolve()
    assert report.artifact_root([model]) is None  # no data Asset: no root
    s3 = SimpleNamespace(name="dagtrain.p.data", uri="s3://bucket/p/data")
    assert report.artifact_root([s3]) is None
    assert report.artifact_root(None) is None


def test_a_report_of_a_run_retried_after_a_killed_rank(tmp_path):
    root, data = make_run(tmp_path)
    assert report.artifact_root([data_asset(root)]) == root.resolve()
    r = report.run_report(root, DAG, "manual__1", [], {"training": {"lr": 0.05, "epochs": 2}}, data)
    assert [e["epoch"] for e in r["epochs"]] == [0, 1]  # the half-written line is not one
    assert [t["resumed_from_step"] for t in r["tries"]] == [None, 20]
    assert r["config_vs_file"] == [{"field": "training.lr", "run": 0.1, "other": 0.05}]
    assert r["ranks"][1]["status"] == "failed" and r["ranks"][1]["last_lines"] == ["bye"]
    assert "SIGKILL" in r["ranks"][1]["how"]
    assert r["sync"]["hidden_share"] == pytest.approx(0.5)  # half the allreduce under backward
    merged = report.merged_trace(root, DAG, "manual__1")
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}


def test_nothing_outside_the_artifact_root_is_read(tmp_path):
    root, _ = make_run(tmp_path)
    # a crafted run id cannot leave the runs folder: its path is made of safe characters
    runs = (root / "runs" / DAG).resolve()
    assert report.run_dir_of(root, DAG, "../../../etc").parent == runs
    assert report.run_dir_of(root, "../..", "manual__1").parent.parent == (root / "runs").resolve()
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    link = report.run_dir_of(root, DAG, "manual__1") / "eval.json"
    link.symlink_to(outside)  # a link out of the root is refused, not followed
    with pytest.raises(ValueError, match="outside the pipeline's artifact root"):
        report.run_report(root, DAG, "manual__1", [], None, None)


def test_the_critical_path_follows_what_each_op_waited_for():
    # load(0) -> fb(1) -> ar(2) -> upd(3); prefetch(4) ends late but nothing waits for it
    ev = [
        {"ph": "X", "name": "load", "ts": 0, "dur": 10, "args": {"index": 0}},
        {"ph": "X", "name": "fb", "ts": 10, "dur": 50, "args": {"index": 1, "after": [0]}},
        {"ph": "X", "name": "ar", "ts": 40, "dur": 40, "args": {"index": 2, "after": [1]}},
        {"ph": "X", "name": "upd", "ts": 80, "dur": 30, "args": {"index": 3, "after": [2, 1]}},
        {"ph": "X", "name": "prefetch", "ts": 0, "dur": 100, "args": {"index": 4}},
    ]
    assert report.critical_path(ev) == [0, 1, 2, 3]
    assert report.critical_path([]) == []


def test_a_step_graphs_trace_names_what_each_task_waited_for(tmp_path):
    from dagtrain.taskgraph import TaskGraph

    g = TaskGraph()
    g.add(lambda: None, name="a", out="x")
    g.add(lambda: None, name="b", inout="x")
    g.add(lambda: None, name="c", in_="x")
    g.run(workers=2, trace=str(tmp_path / "t.json"))
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["args"]["index"]: e["name"] for e in ev if e["ph"] == "X"}
    assert [names[i] for i in report.critical_path(ev)] == ["a", "b", "c"]


def test_ranks_show_their_live_figures_and_a_failed_try_marks_the_others_stopped(tmp_path):
    root, _ = make_run(tmp_path)
    ranks = report.run_dir_of(root, DAG, "manual__1") / "train" / "ranks"
    ranks.mkdir()
    for r, med in ((0, 10.0), (1, 30.0)):
        (ranks / f"rank{r}.json").write_text(
            json.dumps(
                {
                    "rank": r,
                    "host": f"h{r}",
                    "status": "running",
                    "step": 7,
                    "samples_per_second": 100.0,
                    "median_step_ms": med,
                    "p95_step_ms": med * 2,
                }
            )
        )
    stages = [{"task_id": "train", "state": "failed", "map_index": -1}]
    r = report.run_report(root, DAG, "manual__1", stages, None, None)
    by = {k["rank"]: k for k in r["ranks"]}
    assert by[1]["status"] == "failed" and by[0]["status"] == "stopped"
    assert by[0]["host"] == "h0" and by[1]["p95_step_ms"] == 60.0
    assert by[1].get("slowest") and not by[0].get("slowest")


def test_rank_status_writes_percentiles_of_its_own_steps(tmp_path):
    from dagtrain.training.rank.progress import RankStatus, percentile

    assert percentile([], 0.5) is None and percentile([1.0, 2.0, 3.0], 0.95) == 3.0
    s = RankStatus(str(tmp_path), 3, every=3600)
    s.start(0, 10)
    for sec in [0.01] * 9 + [0.1]:
        s.step(sec, 32)
    s.done()
    doc = json.loads((tmp_path / "rank3.json").read_text())
    assert doc["status"] == "done" and doc["step"] == 10 and doc["total_steps"] == 10
    assert doc["median_step_ms"] == pytest.approx(10.0) and doc["p95_step_ms"] == pytest.approx(100)
    assert doc["samples_per_second"] == pytest.approx(320 / 0.19)


def _train_dir(tmp_path, run_id="manual__1"):
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True)
    train = report.run_dir_of(root, DAG, run_id) / "train"
    train.mkdir(parents=True)
    return root, train


def _failure(train, n: int, **rec) -> None:
    (train / f"failure-try{n}.json").write_text(json.dumps(rec))


def test_a_train_task_that_failed_three_times_before_training_lists_three_tries(tmp_path):
    root, train = _train_dir(tmp_path)
    for n in (1, 2, 3):  # bad input, refused by rank 0 before any start line: no retry helps
        record_try(train / "metrics.jsonl", n)
        _failure(
            train,
            n,
            rank=0,
            how=f"rank 0 refused its input (try {n})",
            exit_code=2,
            signal=None,
            host="h0",
            log_tail=["InputError: bad"],
            error="InputError: bad",
            bad_input=True,
        )
    stages = [{"task_id": "train", "map_index": -1, "state": "failed", "try_number": 3}]
    r = report.run_report(root, DAG, "manual__1", stages, None, None)
    assert [t["try"] for t in r["tries"]] == [1, 2, 3]
    for n, t in enumerate(r["tries"], 1):
        assert t["started"] is False and t["resumed_from_step"] is None
        assert t["failure"]["how"] == f"rank 0 refused its input (try {n})"
        assert t["failure"]["bad_input"] is True and t["failure"]["try"] == n
        assert isinstance(t["time"], float)  # when the try began
    assert [f["try"] for f in r["failures"]] == [1, 2, 3]  # the existing key, unchanged
    assert r["ranks"][0]["status"] == "failed"


def test_tries_known_only_from_failure_files_or_airflow_are_listed(tmp_path):
    # a run from before the try lines: only its failure files and Airflow's try_number
    root, train = _train_dir(tmp_path)
    _failure(train, 1, rank=1, how="rank 1 was killed by SIGKILL")
    stages = [{"task_id": "train", "map_index": -1, "state": "running", "try_number": 2}]
    tries = report.run_report(root, DAG, "manual__1", stages, None, None)["tries"]
    assert [(t["try"], t["failure"] is not None, t["started"]) for t in tries] == [
        (1, True, False),
        (2, False, False),
    ]
    assert report.run_report(root, DAG, "manual__1", [], None, None)["tries"][0]["try"] == 1


def test_a_resume_is_listed_under_its_own_try_when_an_earlier_try_never_started(tmp_path):
    root, train = _train_dir(tmp_path)
    m = train / "metrics.jsonl"
    record_try(m, 1)  # try 1 failed before rank 0 wrote its start line
    _failure(train, 1, rank=1, how="rank 1 exited with code 1")
    record_try(m, 2)
    lines = [
        {"kind": "start", "step": 20, "resumed_from_step": 20, "steps_per_epoch": 20, "time": 5.0},
        {"kind": "epoch", "epoch": 1, "train_loss": 0.5},
    ]
    with m.open("a") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
    stages = [{"task_id": "train", "map_index": -1, "state": "success", "try_number": 2}]
    tries = report.run_report(root, DAG, "manual__1", stages, None, None)["tries"]
    assert [t["try"] for t in tries] == [1, 2]
    one, two = tries
    assert not one["started"] and one["failure"]["how"] == "rank 1 exited with code 1"
    assert two["started"] and two["resumed_from_step"] == 20 and two["epochs_done_before"] == 1
    assert two["time"] == 5.0 and two["failure"] is None
    # the progress display of `dagtrain run` reads the same file: a try line is no epoch
    assert [e["epoch"] for e in metrics.epochs(report.read_lines(root, m))] == [1]


def test_a_try_line_is_one_whole_line_appended_after_what_is_there(tmp_path):
    m = tmp_path / "round-01" / "shard-00" / "metrics.jsonl"  # its folder is made
    record_try(str(m), 3)
    record_try(m, 4)
    recs = [json.loads(line) for line in m.read_text().splitlines()]
    assert [(r["kind"], r["try"]) for r in recs] == [("try", 3), ("try", 4)]
    assert m.read_text().endswith("\n") and all(isinstance(r["time"], float) for r in recs)


@pytest.mark.parametrize("left", ["starting", "running"])
def test_a_rank_whose_try_ended_without_its_record_saying_so_shows_as_stopped(tmp_path, left):
    root, data = make_run(tmp_path)
    train = report.run_dir_of(root, DAG, "manual__1") / "train"
    (train / "failure-try1.json").unlink()
    (train / "ranks").mkdir()
    (train / "ranks" / "rank0.json").write_text(json.dumps({"rank": 0, "status": left}))
    stages = [{"task_id": "train", "state": "up_for_retry", "try_number": 1}]
    r = report.run_report(root, DAG, "manual__1", stages, None, data)
    assert r["ranks"][0]["status"] == "stopped", r["ranks"][0]
    stages[0]["state"] = "running"  # while the try runs, the record says where it is
    assert (
        report.run_report(root, DAG, "manual__1", stages, None, data)["ranks"][0]["status"] == left
    )


# rank 0's epoch rows of a regression (validation split) and of a language model (test
# split: no eval_data): the objective's metrics, and the sums they come from
REGRESSION_ROWS = [
    {
        **{"kind": "epoch", "epoch": e, "train_loss": 900.0 - e, "train_mse": 900.0 - e},
        **{"train_mae": 25.0 - e, "train_r2": 0.1 * e, "val_loss": 950.0 - e},
        **{"val_mse": 950.0 - e, "val_mae": 26.0 - e, "val_r2": 0.1 * e - 0.05},
        **{"val_abs_error": 2300.0, "val_target_sum": 13631, "val_target_squares": 2634331},
        **{"val_units": 88, "val_samples": 88, "step": 10 * (e + 1), "total_steps": 30},
    }
    for e in range(3)
]
LANGUAGE_MODEL_ROWS = [
    {
        **{"kind": "epoch", "epoch": e, "train_loss": 3.0 - e, "train_perplexity": 20.0 - e},
        **{"train_accuracy": 0.2 + e / 10, "test_loss": 3.1 - e, "test_perplexity": 22.0 - e},
        **{"test_accuracy": 0.18 + e / 10, "test_correct": 47 + e, "test_units": 260},
        **{"test_samples": 10},
    }
    for e in range(2)
]


def objective_run(tmp_path, rows, run_id="manual__obj"):
    """A run folder whose training wrote ``rows``, with no trace or rank record."""
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True, exist_ok=True)
    train = report.run_dir_of(root, DAG, run_id) / "train"
    train.mkdir(parents=True)
    start = {"kind": "start", "step": 0, "total_steps": 30, "steps_per_epoch": 10}
    (train / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [start, *rows]))
    return root, {"dir": str(root / "data" / "v1"), "version": "v1", "rows": {"train": 9}}


def registered(root, objective, metrics, evaluation=None):
    """A registry of one promoted version whose lineage keeps the config's values."""
    values = {"objective": {"name": objective, "args": {}}, "evaluation": evaluation or {}}
    entry = {"version": 1, "path": "m.pt", "metrics": metrics, "promoted": True}
    entry["lineage"] = {"run_id": "manual__obj", "config_values": values}
    (root / "registry").mkdir(exist_ok=True)
    (root / "registry" / "registry.json").write_text(
        json.dumps({"champion": 1, "versions": [entry]})
    )


def test_a_regression_runs_report_has_a_series_per_metric_and_promotes_on_test_mse(tmp_path):
    root, data = objective_run(tmp_path, REGRESSION_ROWS)
    tested = {"test_loss": 940.0, "test_mse": 940.0, "test_mae": 24.0, "test_r2": 0.2}
    registered(root, "regression", tested | {"test_units": 89, "test_samples": 89})
    params = {"objective": {"name": "regression"}, "evaluation": {"metric": None}}
    r = report.run_report(root, DAG, "manual__obj", [], params, data)
    assert r["metrics"] == ["loss", "mse", "mae", "r2"]  # the sums are no metric
    assert r["promotion_metric"] == "test_mse"
    for m in r["metrics"]:  # each chart's train and validation series, an epoch a point
        assert [e[f"train_{m}"] for e in r["epochs"]] == [x[f"train_{m}"] for x in REGRESSION_ROWS]
        assert [e[f"val_{m}"] for e in r["epochs"]] == [x[f"val_{m}"] for x in REGRESSION_ROWS]
    (curve,) = report.curves_of(root, DAG, ["manual__obj"])
    assert curve["metrics"] == ["loss", "mse", "mae", "r2"] and len(curve["epochs"]) == 3
    reg = report.registry_of(root)
    assert reg["metric"] == "test_mse" and reg["columns"] == ["test_mse", "test_loss"]


def test_a_language_models_report_promotes_on_perplexity_unless_the_config_says(tmp_path):
    root, data = objective_run(tmp_path, LANGUAGE_MODEL_ROWS)
    tested = {"test_loss": 2.1, "test_perplexity": 8.2, "test_accuracy": 0.3}
    registered(root, "language_model", tested, {"metric": "test_accuracy"})
    r = report.run_report(root, DAG, "manual__obj", [], None, data)
    assert r["metrics"] == ["loss", "perplexity", "accuracy"]
    # no Params, no config: the objective's first metric, as the epoch rows report it
    assert r["promotion_metric"] == "test_perplexity"
    params = {"objective": {"name": "language_model"}, "evaluation": {"metric": "test_loss"}}
    assert report.run_report(root, DAG, "manual__obj", [], params, data)["promotion_metric"] == (
        "test_loss"
    )
    # ... and the registry's newest entry names evaluation.metric: the table shows it
    assert report.registry_of(root)["columns"] == ["test_accuracy", "test_loss"]


def test_a_registry_from_before_configs_were_kept_shows_accuracy_or_the_loss(tmp_path):
    assert report.promotion_metric(None, {"test_accuracy": 0.9}) == "test_accuracy"
    assert report.promotion_metric(None, {"test_mse": 3.0}) == "test_loss"
    assert report.promotion_metric({"objective": {"name": "pkg.mod:mine"}}) == "test_loss"
    assert report.registry_of(tmp_path)["columns"] == ["test_loss"]  # no registry: no entry


# a classification with the training recipe: each row's LR (its last step's), mean
# gradient norm and share of steps clipped; val loss best at epoch 4 (index 3), then worse
RECIPE_ROWS = [
    {
        **{
            "kind": "epoch",
            "epoch": e,
            "train_loss": 1.0 / (e + 1),
            "train_accuracy": 0.5 + e / 20,
        },
        **{"val_loss": [0.9, 0.5, 0.3, 0.2, 0.25, 0.26][e], "val_accuracy": 0.6 + e / 20},
        **{"val_correct": 60 + e, "val_samples": 100, "lr": 0.05 * (1 - e / 6)},
        **{"grad_norm": 1.5 - e / 5, "clip_rate": max(0.0, 0.6 - e / 5)},
        **{"step": 10 * (e + 1), "total_steps": 60},
    }
    for e in range(6)
]
STOPPED = {
    **{"metric": "val_loss", "direction": "min", "better": "lower", "best_epoch": 3, "best": 0.2},
    **{"stopped_after_epoch": 5, "patience": 2, "min_delta": 0.001},
    "why": "val loss did not improve by more than 0.001 for 2 epoch(s) after epoch 4",
}
CHAMPION = {"kind": "champion", "version": 3, "path": "/r/models/v0003/model.pt", "note": None}


def recipe_run(tmp_path, early_stop=STOPPED, init=CHAMPION):
    """A finished run of RECIPE_ROWS whose result says its early stop and warm start."""
    root, data = objective_run(tmp_path, RECIPE_ROWS, run_id="manual__recipe")
    result = {"world": 2, "samples_per_second": 900.0, "epochs": RECIPE_ROWS}
    result |= {"early_stop": early_stop, "init": init, "config": {"training": {}}}
    train = report.run_dir_of(root, DAG, "manual__recipe") / "train"
    (train / "result.json").write_text(json.dumps(result))
    config = {"training": {"lr": 0.05, "max_grad_norm": 1.0, "lr_schedule": "cosine"}}
    (train / "config.json").write_text(json.dumps(config))
    return root, data


def test_a_runs_report_carries_each_epochs_lr_and_its_early_stop_and_warm_start(tmp_path):
    root, data = recipe_run(tmp_path)
    r = report.run_report(root, DAG, "manual__recipe", [], None, data)
    for key in ("lr", "grad_norm", "clip_rate"):  # each epoch's, for the page's curves
        assert [e[key] for e in r["epochs"]] == [x[key] for x in RECIPE_ROWS], key
    assert r["metrics"] == ["loss", "accuracy"]  # the recipe's figures are no metric
    assert r["result"]["early_stop"] == STOPPED and r["result"]["init"] == CHAMPION
    assert "epochs" not in r["result"] and r["config"]["training"]["max_grad_norm"] == 1.0
    (curve,) = report.curves_of(root, DAG, ["manual__recipe"])
    assert [e["lr"] for e in curve["epochs"]] == [x["lr"] for x in RECIPE_ROWS]
    assert curve["metrics"] == ["loss", "accuracy"]
    # a summary from before the recipe (or while init is being written): None, not missing
    root, data = recipe_run(tmp_path / "old", early_stop=None, init=None)
    old = report.run_report(root, DAG, "manual__recipe", [], None, data)["result"]
    assert old["early_stop"] is None and old["init"] is None
