"""Every example pipeline end to end through Airflow: ``dagtrain run`` (which runs
``dag.test()`` on an embedded SQLite database) on tiny configs, real operators, real
ranks. Each run is a fresh interpreter, so Airflow reads its home from the environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dagtrain.config.schema import MAX_PARAMETERS

REPO = Path(__file__).parents[2]
DAGTRAIN = [sys.executable, "-m", "dagtrain"]

pytestmark = pytest.mark.slow


def stage(tmp_path: Path, example: str, yaml_text: str) -> Path:
    """A DAGs folder holding the example's DAG file and a tiny config beside it."""
    dags = tmp_path / "dags"
    dags.mkdir(exist_ok=True)
    shutil.copy(REPO / "dags" / f"{example}.py", dags / f"{example}.py")
    cfg = dags / f"{example}.yaml"
    cfg.write_text(yaml_text + f"artifacts: {{root: {tmp_path / 'art'}}}\n")
    return cfg


def dagtrain_run(
    tmp_path: Path, cfg: Path, *sets: str, pythonpath: bool = True
) -> subprocess.CompletedProcess:
    """``dagtrain run`` piped; without ``pythonpath``, no PYTHONPATH at all (a model
    module beside the config must be found through its folder alone)."""
    args = [*DAGTRAIN, "run", str(cfg), "--home", str(tmp_path / "home")]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "COLUMNS": "200"}
    if not pythonpath:
        env.pop("PYTHONPATH", None)
    return subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, env=env, timeout=600, check=False
    )


def task_rows(tmp_path: Path) -> dict[str, tuple[str, int]]:
    con = sqlite3.connect(tmp_path / "home" / "airflow" / "airflow.db")
    try:
        rows = con.execute(
            "SELECT task_id, map_index, state, try_number FROM task_instance"
        ).fetchall()
    finally:
        con.close()
    return {(t if m < 0 else f"{t}[{m}]"): (s, n) for t, m, s, n in rows}


def run_artifacts(tmp_path: Path, name: str) -> Path:
    runs = list((tmp_path / "art" / name / "runs" / f"dagtrain_{name}").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def every_file_is_named_by_the_layout(root: Path, stdout: str) -> None:
    """Each file the run wrote under the pipeline's artifact root is one the layout type
    names, and what the CLI summary, the operators' outputs and the training page show
    of them is found through it."""
    from dagtrain.plugins import report
    from dagtrain.records.layout import ArtifactLayout

    layout = ArtifactLayout(root, f"dagtrain_{root.name}")
    files = [f for f in root.rglob("*") if f.is_file()]
    assert files
    unnamed = [str(f.relative_to(root)) for f in files if layout.describe(f) is None]
    assert not unnamed, unnamed
    (dag_runs,) = list(layout.runs.iterdir())  # the runs of the one DAG that ran
    (run_dir,) = list(dag_runs.iterdir())
    (run_id,) = re.findall(r"^run (\S+): ", stdout, re.M)  # the summary's line
    run = layout.run(run_id)
    assert run.dir == run_dir
    assert f"artifacts: {run.dir}" in stdout, stdout
    ev = json.loads(run.evaluation.read_text())
    assert layout.describe(ev["checkpoint"]) in ("run train checkpoint", "round global checkpoint")
    assert layout.describe(ev["manifest"]) == "prepared data"
    stages = [{"task_id": "train", "state": "success", "try_number": 1}]
    page = report.run_report(root, layout.dag_id, run_id, stages, None, None)
    assert page["evaluation"] == ev
    assert page["epochs"] or page["rounds"]
    if run.train.dir.exists():
        assert f"step traces (open in https://ui.perfetto.dev): {run.train.traces}" in stdout
        assert page["result"] and page["config"] and page["trace_steps"]
        assert {r["rank"] for r in page["ranks"]} == set(run.train.rank_records())
        assert [f["try"] for f in page["failures"]] == list(run.train.failures())


TINY = """
data: {source: digits}
model: {name: mlp, args: {hidden: [32]}}
training: {epochs: 2, batch_size: 64, lr: 0.1, retry_delay_seconds: 0}
distributed: {backend: mpi, ranks: 2}
"""


def test_scheduled_retraining_runs_end_to_end(tmp_path):
    cfg = stage(tmp_path, "digits_retraining", "name: sched\n" + TINY)
    r = dagtrain_run(tmp_path, cfg, "training.epochs=3", "training.lr=0.125")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = task_rows(tmp_path)
    assert rows == {
        "prepare_data": ("success", 1),
        "train": ("success", 1),
        "evaluate": ("success", 1),
        "promote": ("success", 1),
    }
    run = run_artifacts(tmp_path, "sched")
    result = json.loads((run / "train" / "result.json").read_text())
    assert result["world"] == 2 and result["backend"] == "mpi"
    assert len(result["epochs"]) == 3  # the --set reached the task through the run's conf
    # one value's walk: --set -> the run's conf -> the rank's TrainConfig, the file the
    # ranks were given, what rank 0 reports it received, and every checkpoint
    received = json.loads((run / "train" / "config.json").read_text())
    assert received == result["config"]
    assert received["training"]["lr"] == 0.125 and received["training"]["epochs"] == 3
    assert received["model"] == {
        "name": "mlp",
        "args": {"hidden": [32]},
        "max_parameters": MAX_PARAMETERS,  # the file's bound, as every field's default
    }
    assert received["distributed"]["ranks"] == 2
    from dagtrain.training.rank import checkpoint

    ckpts = sorted((run / "train" / "checkpoints").glob("ckpt-*.pt"))
    assert ckpts
    for c in ckpts:
        assert json.loads(checkpoint.load(c)["config"]) == received
    ev = json.loads((run / "eval.json").read_text())
    assert ev["metrics"]["test_accuracy"] > 0.8
    reg = json.loads((tmp_path / "art" / "sched" / "registry" / "registry.json").read_text())
    assert reg["champion"] == 1 and reg["versions"][0]["lineage"]["data_version"]
    # piped: plain progress lines, in order, and no ANSI code at all
    assert "\x1b[" not in r.stdout + r.stderr
    order = [
        "prepare_data started",
        "prepare_data succeeded in",
        "train started",
        "train epoch 1/3: loss",
        "train epoch 3/3: loss",
        "train succeeded in",
        "evaluate started",
        "promote succeeded in",
        "validation accuracy",
        "test accuracy",
        "promoted v1 (",
    ]
    at = [r.stdout.find(s) for s in order]
    assert -1 not in at and at == sorted(at), (at, r.stdout)
    assert re.search(r"^promoted v1 \([\d.]+\), the first champion$", r.stdout, re.M)
    # the training task's XCom names its metrics by the split they come from
    assert result["val_accuracy"] > 0.8 and "test_accuracy" not in result
    # artifacts get the permissions of any new file of the process (umask), not 0600
    mask = os.umask(0)
    os.umask(mask)
    for f in (
        tmp_path / "art" / "sched" / "registry" / "registry.json",
        tmp_path / "art" / "sched" / "registry" / "models" / "v0001" / "model.pt",
        run / "train" / "result.json",
        *(run / "train" / "checkpoints").glob("ckpt-*.pt"),
    ):
        assert f.stat().st_mode & 0o777 == 0o666 & ~mask, f
    # each rank's trace is a process of its own in Perfetto
    for rank in (0, 1):
        events = json.loads((run / "train" / "traces" / f"step-rank{rank}.json").read_text())
        meta = [e for e in events["traceEvents"] if e["name"] == "process_name"]
        assert meta[0]["pid"] == rank and meta[0]["args"]["name"] == f"rank {rank}"


def test_asset_scheduled_retraining_runs_and_a_worse_model_is_not_promoted(tmp_path):
    """Its model is the DAG author's own module, beside the config and on no PYTHONPATH
    (once a test of its own, with a run of its own): it trains in both runs, and each
    task try's log file is named at the end."""
    cfg = stage(
        tmp_path,
        "digits_on_new_data",
        "name: fresh\nschedule: {asset: digits_incoming}\n"
        "evaluation: {min_improvement: 0.5}\n"
        + TINY.replace(
            "model: {name: mlp, args: {hidden: [32]}}",
            "model: {name: 'my_models:small_mlp', args: {width: 16}}",
        ),
    )
    assert "my_models:small_mlp" in cfg.read_text()
    shutil.copy(Path(__file__).parent / "pylib" / "my_models.py", cfg.parent / "my_models.py")
    first = dagtrain_run(tmp_path, cfg, pythonpath=False)
    assert first.returncode == 0, first.stdout + first.stderr
    # cannot beat the champion by 0.5; warm-started from it (training.init: champion)
    second = dagtrain_run(tmp_path, cfg, "training.init=champion", pythonpath=False)
    assert second.returncode == 0, second.stdout + second.stderr
    logs = re.findall(r"^  (\w+) try (\d+): (\S+)$", first.stdout, re.M)
    assert [t for t, _, _ in logs] == ["prepare_data", "train", "evaluate", "promote"], first.stdout
    assert all(Path(p).exists() for _, _, p in logs)
    # each run's progress is its own: the second shows nothing of the first
    ids = [re.search(r"run (manual__\S+): success", x.stdout).group(1) for x in (first, second)]
    assert ids[0] != ids[1] and ids[0] not in second.stdout
    for x in (first, second):
        assert x.stdout.count("train epoch ") == 2 and x.stdout.count("train started") == 1
    assert re.search(r"^promoted v1 \(", first.stdout, re.M), first.stdout
    assert re.search(
        r"^not promoted: test accuracy [\d.]+ does not beat the champion v1's [\d.]+ "
        r"by more than 0\.5$",
        second.stdout,
        re.M,
    ), second.stdout
    assert task_rows(tmp_path)["promote"][0] in ("success", "skipped")
    reg = json.loads((tmp_path / "art" / "fresh" / "registry" / "registry.json").read_text())
    assert [v["promoted"] for v in reg["versions"]] == [True, False]
    assert reg["champion"] == 1
    assert "does not beat" in reg["versions"][1]["reason"]
    # the warm start: said at the end, and in the second version's lineage
    assert "started from champion v1" not in first.stdout
    assert re.search(
        r"^started from champion v1 \(training\.init: champion\)$", second.stdout, re.M
    )
    assert reg["versions"][0]["lineage"]["init"]["kind"] == "scratch"
    init = reg["versions"][1]["lineage"]["init"]
    assert (init["kind"], init["version"], init["path"]) == (
        "champion",
        1,
        reg["versions"][0]["path"],
    )


def test_round_based_training_maps_shards_and_syncs_each_round(tmp_path):
    cfg = stage(
        tmp_path,
        "digits_rounds",
        "name: rnd\npipeline: rounds\ndata: {source: digits}\n"
        "model: {name: mlp, args: {hidden: [32]}}\n"
        "training: {batch_size: 32, optimizer: adamw, lr: 0.003, retry_delay_seconds: 0}\n"
        "distributed: {backend: local, ranks: 1}\n"
        "rounds: {rounds: 2, shards: 2, local_steps: 15}\n",
    )
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = task_rows(tmp_path)
    for name in (
        "round_0_train[0]",
        "round_0_train[1]",
        "round_1_train[0]",
        "round_1_train[1]",
        "round_0_sync",
        "round_1_sync",
        "evaluate",
        "promote",
    ):
        assert rows[name][0] == "success", (name, rows)
    run = run_artifacts(tmp_path, "rnd")
    assert sorted(p.name for p in (run / "rounds" / "global").glob("ckpt-*.pt")) == [
        "ckpt-00000001.pt",
        "ckpt-00000002.pt",
    ]
    ev = json.loads((run / "eval.json").read_text())
    assert ev["checkpoint"].endswith("ckpt-00000002.pt")
    assert ev["metrics"]["test_accuracy"] > 0.8
    every_file_is_named_by_the_layout(tmp_path / "art" / "rnd", r.stdout)


def test_a_training_task_that_fails_once_resumes_on_its_retry(tmp_path):
    marker = tmp_path / "failed-once"
    # 1258 training samples / 64 = 20 steps an epoch; rank 1 fails in step 30 (epoch 2)
    cfg = stage(
        tmp_path,
        "digits_retraining",
        "name: flaky\n"
        "data: {source: digits}\n"
        f"model: {{name: 'tests.unit.training.factory:fail_once', "
        f"args: {{marker: '{marker}', at_call: 30}}}}\n"
        "training: {epochs: 3, batch_size: 64, lr: 0.1, retries: 1, retry_delay_seconds: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\n",
    )
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.exists()  # the fault did happen
    assert task_rows(tmp_path)["train"] == ("success", 2)
    # the retry, as the user saw it
    assert re.search(r"^train try 1 failed, Airflow will retry it: RankFailure: ", r.stdout, re.M)
    assert "train started (try 2)" in r.stdout
    assert re.search(r"^train try 2: resumed from step 20 \(1 epoch", r.stdout, re.M), r.stdout
    result = json.loads((run_artifacts(tmp_path, "flaky") / "train" / "result.json").read_text())
    assert result["resumed_from_step"] == 20  # the checkpoint of epoch 1
    assert result["epochs_trained_now"] == 2  # epoch 1 was not trained again
    assert len(result["epochs"]) == 3 and result["steps"] == 60
    # the failed try's record too, beside the rest
    assert (run_artifacts(tmp_path, "flaky") / "train" / "failure-try1.json").exists()
    every_file_is_named_by_the_layout(tmp_path / "art" / "flaky", r.stdout)


BAD_LABELS = "1.0,2.0,0.5\n3.0,4.0,1.5\n5.0,6.0,0.5\n"  # labels that are not classes


def test_a_missing_data_file_is_refused_before_airflow_starts(tmp_path):
    cfg = stage(tmp_path, "digits_retraining", "name: nodata\ndata: {source: missing.npz}\n")
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode == 2
    assert "data.source 'missing.npz': no such file" in r.stderr, r.stderr
    assert not (tmp_path / "home" / "airflow" / "airflow.db").exists()
    # the model's check runs while Airflow's processes make ready: its refusal stops them
    # before the database exists, and a home this command made is not left behind
    cfg = stage(tmp_path, "digits_retraining", "name: badargs\nmodel: {args: {hiddn: [16]}}\n")
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode == 2, r.stderr
    assert "model.args {'hiddn': [16]}" in r.stderr, r.stderr
    assert "starting Airflow" not in r.stdout, r.stdout
    assert not (tmp_path / "home").exists()


def test_a_bare_config_runs_through_a_generated_dag_and_bad_input_is_not_retried(tmp_path):
    """Also what a failing pipeline does (once a test of its own, with the example's DAG
    file: the same run through the same operators): it exits non-zero naming the stage
    and why, and the stage's task is failed."""
    cfg = tmp_path / "elsewhere" / "bare.yaml"
    cfg.parent.mkdir()
    (cfg.parent / "bad.csv").write_text(BAD_LABELS)
    cfg.write_text(
        "name: bare\ndata: {source: bad.csv}\ntraining: {retries: 2, retry_delay_seconds: 5}\n"
        f"distributed: {{backend: local, ranks: 1}}\nartifacts: {{root: {tmp_path / 'art'}}}\n"
    )
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode != 0
    assert "prepare_data" in r.stderr and "labels must be integers" in r.stderr, r.stderr
    assert task_rows(tmp_path)["prepare_data"] == ("failed", 1)  # no retry of bad input
    # the path is resolved against the config's own folder, and the error says so
    assert str(cfg.parent / "bad.csv") in r.stderr, r.stderr


def test_the_pipeline_parallel_example_trains_evaluates_and_promotes(tmp_path):
    # the example's own file, shortened: 2 stages x 1 replica, 4 microbatches a step
    text = (REPO / "dags" / "transformer_pipeline.yaml").read_text()
    # two epochs reach about 0.5; evaluation is the file's alone (a conf may not lower it)
    assert "threshold: 0.8" in text
    text = text.replace("threshold: 0.8", "threshold: 0.3")
    cfg = stage(tmp_path, "transformer_pipeline", text)
    r = dagtrain_run(tmp_path, cfg, "training.epochs=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^promoted v1 \([\d.]+\), the first champion$", r.stdout, re.M), r.stdout
    # the closing lines say how the pipeline ran: its layout, split and the order chosen
    assert "pipeline: 2 stages x 1 replica, 4 microbatches" in r.stdout, r.stdout
    said = r"^pipeline split \[\d\] \(auto\), order (1f1b|gpipe) \(measured: \w+ [\d.]+ ms, "
    assert re.search(said, r.stdout, re.M), r.stdout
    run = run_artifacts(tmp_path, "transformer_pipeline")
    result = json.loads((run / "train" / "result.json").read_text())
    p = result["pipeline"]
    assert (p["stages"], p["replicas"], p["microbatches"], p["chunks"]) == (2, 1, 4, 1)
    # order: auto measured gpipe and 1f1b on the first steps and kept the faster
    trial = p["order_trial"]
    assert trial["chosen"] in ("1f1b", "gpipe") and p["order"] == trial["chosen"], trial
    assert set(trial["median_step_ms"]) == {"1f1b", "gpipe"}, trial
    assert p["how"] == "auto" and len(p["split"]) == 1 and p["stage"] == 0
    # each rank's record says its stage; each trace shows every op of its stage
    for rank in (0, 1):
        rec = json.loads((run / "train" / "ranks" / f"rank{rank}.json").read_text())
        assert (rec["stage"], rec["replica"], rec["status"]) == (rank, 0, "done"), rec
        events = json.loads((run / "train" / "traces" / f"step-rank{rank}.json").read_text())
        names = {e["name"] for e in events["traceEvents"] if e.get("ph") == "X"}
        want = {f"F{m}" for m in range(4)} | {f"B{m}" for m in range(4)}
        sent = "send-act" if rank == 0 else "send-grad"
        want |= {f"{sent}{m}" for m in range(4)}
        assert want <= names, (rank, sorted(names))
    # the page's report and the existing evaluate stage read the whole model
    ev = json.loads((run / "eval.json").read_text())
    assert ev["metrics"]["test_accuracy"] > 0.3
    every_file_is_named_by_the_layout(tmp_path / "art" / "transformer_pipeline", r.stdout)


def test_the_language_model_example_trains_on_two_stages_and_promotes_on_perplexity(tmp_path):
    # the example's own file and text, one epoch: next-token loss on 2 pipeline stages
    cfg = stage(tmp_path, "language_model", (REPO / "dags" / "language_model.yaml").read_text())
    (cfg.parent / "data").mkdir()
    shutil.copy(REPO / "dags" / "data" / "corpus.txt", cfg.parent / "data" / "corpus.txt")
    # (one epoch: the file's warmup and clipping, no cosine decay within it)
    r = dagtrain_run(tmp_path, cfg, "training.epochs=1", "training.lr_schedule=constant")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^promoted v1 \(.*\), the first champion$", r.stdout, re.M), r.stdout
    assert re.search(r"^train epoch 1/1: .*, lr 1\.0e-2, gnorm [\d.]+", r.stdout, re.M), r.stdout
    run = run_artifacts(tmp_path, "language_model")
    result = json.loads((run / "train" / "result.json").read_text())
    assert result["pipeline"]["stages"] == 2
    (epoch,) = result["epochs"]
    assert {"train_loss", "train_perplexity", "val_perplexity", "val_accuracy"} <= set(epoch)
    # the whole model's gradient norm, added over the 2 stages, clipped at 1.0
    assert epoch["grad_norm"] > 0 and 0 <= epoch["clip_rate"] <= 1 and epoch["lr"] == 0.01
    assert result["early_stop"]["metric"] == "val_perplexity", result["early_stop"]
    ev = json.loads((run / "eval.json").read_text())
    m = ev["metrics"]
    # bytes of the text: a perplexity under 20 after one epoch (256 for a uniform guess)
    assert 1 < m["test_perplexity"] < 20 and m["test_units"] == 64 * m["test_samples"], m
    assert ev["better"] and "threshold" not in ev["reason"], ev


def test_the_regression_example_trains_and_promotes_on_test_mse(tmp_path):
    text = (REPO / "dags" / "diabetes_regression.yaml").read_text()
    cfg = stage(tmp_path, "diabetes_regression", text)
    r = dagtrain_run(tmp_path, cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^promoted v1 \(test mse [\d.]+\), the first champion$", r.stdout, re.M)
    run = run_artifacts(tmp_path, "diabetes")
    ev = json.loads((run / "eval.json").read_text())
    m = ev["metrics"]
    assert {"test_mse", "test_mae", "test_r2", "test_loss"} <= set(m), m
    assert m["test_r2"] > 0.3 and ev["better"], m  # diabetes: a linear fit reaches ~0.45
    assert (ev["metric"], ev["direction"]) == ("test_mse", "min"), ev
