"""MLflow tracking and Model Registry against a real MLflow server (its own venv, SQLite
store, local artifact root), pipelines run through Airflow by ``dagtrain run``: the
MLflow run holds the run's own per-epoch metrics and effective config, promote keeps
MLflow's ``champion`` alias where dagtrain's registry says, a retried try logs into the
same MLflow run, and a server that stops mid-run costs a warning naming the connection,
never the training or the promotion (and the missed logging is done when it is back).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .mlflow_server import CannotBuild, MlflowServer, server_venv

pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")

REPO = Path(__file__).parents[2]
DAGTRAIN = [sys.executable, "-m", "dagtrain"]
CONN = "mlflow_default"
NOT_METRICS = {"kind", "epoch", "step", "total_steps", "time", "try"}

# up to three `dagtrain run`s a test (each starts an embedded Airflow): more than the
# suite's 300 s default on a loaded machine; each run has its own deadline too
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def venv() -> Path:
    try:
        return server_venv()
    except CannotBuild as e:
        pytest.skip(f"no MLflow server on this machine: {e}")


@pytest.fixture(scope="module")
def server(venv, tmp_path_factory):
    s = MlflowServer(venv, tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield s
    finally:
        s.stop()


def client(url: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url, registry_uri=url)


def write_config(tmp_path: Path, name: str, body: str) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir(exist_ok=True)
    (dags / f"{name}.py").write_text((REPO / "dags" / "digits_retraining.py").read_text())
    cfg = dags / f"{name}.yaml"
    cfg.write_text(
        f"name: {name}\n{body}schedule: {{cron: null}}\n"
        f"artifacts: {{root: {tmp_path / 'art'}}}\ntracking: {{}}\n"
    )
    return cfg


def dagtrain_run(tmp_path: Path, cfg: Path, url: str, *sets: str) -> subprocess.CompletedProcess:
    args = [*DAGTRAIN, "run", str(cfg), "--home", str(tmp_path / "home")]
    for s in sets:
        args += ["--set", s]
    # how a user gives `dagtrain run`'s embedded Airflow the connection
    env = {**os.environ, "COLUMNS": "200", f"AIRFLOW_CONN_{CONN.upper()}": url}
    return subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, env=env, timeout=600, check=False
    )


def run_dirs(tmp_path: Path, name: str) -> list[Path]:
    runs = tmp_path / "art" / name / "runs"
    return sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def epochs(metrics_file: Path) -> dict[int, dict[str, Any]]:
    """{epoch: its row} of a metrics file, the newest try's row of each epoch."""
    rows = {}
    for line in metrics_file.read_text().splitlines():
        m = json.loads(line)
        if m.get("kind") == "epoch":
            rows[m["epoch"]] = m
    return rows


def dotted(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config's leaves under dotted keys, as MLflow keeps params (strings; lists, and a
    model's args, as JSON)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and k != "args":
            out |= dotted(v, key + ".")
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return out


def mlflow_run(c: Any, experiment: str, airflow_run_id: str) -> Any:
    exp = c.get_experiment_by_name(experiment)
    found = c.search_runs(
        [exp.experiment_id], filter_string=f"tags.`airflow.run_id` = '{airflow_run_id}'"
    )
    assert len(found) == 1, found  # one MLflow run per DAG run
    return found[0]


def history(c: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))


def assert_run_matches(c: Any, run_dir: Path, experiment: str) -> Any:
    """The MLflow run of ``run_dir`` holds the run's own metrics, config and files."""
    rec = read_json(run_dir / "mlflow.json")
    r = c.get_run(rec["run_id"])
    assert r.info.experiment_id == rec["experiment_id"]
    airflow_run = r.data.tags["airflow.run_id"]
    assert mlflow_run(c, experiment, airflow_run).info.run_id == rec["run_id"]
    assert r.data.tags["airflow.dag_id"] == f"dagtrain_{experiment}"
    page = f"/dagtrain/?dag_id=dagtrain_{experiment}&run_id={quote(airflow_run, safe='')}"
    assert r.data.tags["dagtrain.page"].endswith(page)
    # every epoch's metrics, at their step, once each: the run's own (metrics.jsonl)
    rows = epochs(run_dir / "train" / "metrics.jsonl")
    assert rows
    keys = {k for row in rows.values() for k, v in row.items() if k not in NOT_METRICS}
    assert {"train_loss", "val_accuracy", "samples_per_second"} <= keys
    for key in keys:
        want = sorted((row["step"], float(row[key])) for row in rows.values() if key in row)
        assert history(c, rec["run_id"], key) == want, key
    assert history(c, rec["run_id"], "epoch") == sorted(
        (row["step"], float(e)) for e, row in rows.items()
    )
    result = read_json(run_dir / "train" / "result.json")
    assert r.data.metrics["ranks"] == result["world"] == 2
    assert r.data.metrics["world_changes"] == len(result["world_changes"])
    # the params are the effective config (what the ranks received)
    assert r.data.params == dotted(read_json(run_dir / "train" / "config.json"))
    # the test metrics of evaluate, in the same run
    ev = read_json(run_dir / "eval.json")
    for k, v in ev["metrics"].items():
        assert r.data.metrics[k] == v, k
    # the step traces and the data manifest as artifacts
    top = {a.path for a in c.list_artifacts(rec["run_id"])}
    assert {"traces", "data", "model"} <= top, top
    traces = {Path(a.path).name for a in c.list_artifacts(rec["run_id"], "traces")}
    assert traces == {f.name for f in (run_dir / "train" / "traces").iterdir()}
    assert [a.path for a in c.list_artifacts(rec["run_id"], "data")] == ["data/manifest.json"]
    return r


def test_runs_metrics_params_and_the_champion_alias_follow_dagtrain(tmp_path, server):
    c = client(server.url)
    cfg = write_config(
        tmp_path,
        "mlf",
        "data: {source: digits}\nmodel: {name: mlp, args: {hidden: [32]}}\n"
        "training: {epochs: 2, batch_size: 64, lr: 0.1, retries: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\n",
    )
    # a weak first model, a better one (promoted: the alias moves), a weak one (stays)
    for sets in (
        ("training.lr=0.002", "training.epochs=1"),
        ("training.epochs=3",),
        ("training.lr=0.002", "training.epochs=1"),
    ):
        r = dagtrain_run(tmp_path, cfg, server.url, *sets)
        assert r.returncode == 0, r.stdout + r.stderr
    runs = run_dirs(tmp_path, "mlf")
    assert len(runs) == 3
    for run_dir in runs:
        assert_run_matches(c, run_dir, "mlf")
    assert read_json(runs[1] / "train" / "config.json")["training"]["epochs"] == 3

    reg = read_json(tmp_path / "art" / "mlf" / "registry" / "registry.json")
    assert [v["promoted"] for v in reg["versions"]] == [True, True, False]
    assert reg["champion"] == 2
    versions = {mv.tags["dagtrain.version"]: mv for mv in c.search_model_versions("name='mlf'")}
    assert sorted(versions) == ["1", "2", "3"]  # every challenger a version
    for v in reg["versions"]:
        mv = versions[str(v["version"])]
        assert mv.tags["dagtrain.verdict"] == ("promoted" if v["promoted"] else "not promoted")
        assert mv.tags["dagtrain.reason"] == v["reason"]
        assert mv.run_id == read_json(runs[v["version"] - 1] / "mlflow.json")["run_id"]
    # the champion alias on dagtrain's champion only
    assert c.get_registered_model("mlf").aliases == {"champion": versions["2"].version}
    # what the training page links to, from the records
    from dagtrain.plugins import report

    root = tmp_path / "art" / "mlf"
    page_reg = report.registry_of(root)
    assert page_reg["mlflow"]["2"]["url"] == (
        f"{server.url}/#/models/mlf/versions/{versions['2'].version}"
    )
    rec = read_json(runs[0] / "mlflow.json")
    link = report.run_report(root, runs[0].name, [], None, None)["mlflow"]
    assert link["url"] == f"{server.url}/#/experiments/{rec['experiment_id']}/runs/{rec['run_id']}"
    assert link["pending"] is False


def test_a_retried_try_logs_into_the_same_mlflow_run(tmp_path, server):
    c = client(server.url)
    marker = tmp_path / "failed-once"
    cfg = write_config(
        tmp_path,
        "mlflaky",
        "data: {source: digits}\n"
        f"model: {{name: 'tests.unit.training.factory:fail_once', "
        f"args: {{marker: '{marker}', at_call: 30}}}}\n"
        "training: {epochs: 3, batch_size: 64, lr: 0.1, retries: 1, retry_delay_seconds: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\n",
    )
    r = dagtrain_run(tmp_path, cfg, server.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.exists()  # try 1 did fail
    assert "train started (try 2)" in r.stdout
    (run_dir,) = run_dirs(tmp_path, "mlflaky")
    run = assert_run_matches(c, run_dir, "mlflaky")  # one run, each epoch once
    assert run.data.tags["airflow.try_number"] == "2"
    assert len(epochs(run_dir / "train" / "metrics.jsonl")) == 3
    assert run.info.status == "FINISHED"


def test_a_server_stopped_mid_run_costs_a_warning_never_the_model(tmp_path, venv, monkeypatch):
    server = MlflowServer(venv, tmp_path / "mlflow").start()
    stopped = threading.Event()

    def stop_once_the_run_is_recorded() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not stopped.is_set():
            if list((tmp_path / "art").glob("mldown/runs/*/mlflow.json")):
                server.stop(kill=True)
                stopped.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=stop_once_the_run_is_recorded, daemon=True)
    try:
        cfg = write_config(
            tmp_path,
            "mldown",
            "data: {source: digits}\n"
            "model: {name: 'tests.unit.training.factory:slow', args: {seconds: 0.1}}\n"
            "training: {epochs: 2, batch_size: 64, lr: 0.1, retries: 0}\n"
            "distributed: {backend: mpi, ranks: 2}\n",
        )
        watcher.start()
        r = dagtrain_run(tmp_path, cfg, server.url)
        stopped.set()
        watcher.join(10)
        assert r.returncode == 0, r.stdout + r.stderr
        (run_dir,) = run_dirs(tmp_path, "mldown")
        # training completed and dagtrain's registry promoted
        reg = read_json(tmp_path / "art" / "mldown" / "registry" / "registry.json")
        assert reg["champion"] == 1 and reg["versions"][0]["promoted"]
        assert len(epochs(run_dir / "train" / "metrics.jsonl")) == 2
        # the task logs name the connection, once per stage
        logs = tmp_path / "home" / "logs"
        for task in ("train", "evaluate", "promote"):
            (log,) = list(logs.rglob(f"task_id={task}/attempt=1.log"))
            text = log.read_text()
            assert text.count(f"MLflow tracking: connection '{CONN}'") == 1, (task, text[-3000:])
        # what was not logged waits in the run's folder; the XComs say so
        pending = [i["part"] for i in read_json(run_dir / "mlflow-pending.json")["pending"]]
        assert {"train", "evaluate", "promote"} <= set(pending), pending
        train_xcom = xcom(tmp_path, "train")
        assert train_xcom["tracking"]["ok"] is False
        assert train_xcom["tracking"]["connection"] == CONN
        assert train_xcom["tracking"]["error"]
        assert xcom(tmp_path, "promote")["tracking"]["ok"] is False

        # the server back (the same store): a stage of the run does what was missed
        server = MlflowServer(venv, tmp_path / "mlflow", port=server.port).start()
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", server.url)
        from dagtrain.config import load_config
        from dagtrain.stages.registry import tracker_of

        airflow_run = xcom_run_id(tmp_path)
        tracker = tracker_of(load_config(cfg), airflow_run, {"run_id": airflow_run}, None)
        assert tracker.report()["ok"] and not (run_dir / "mlflow-pending.json").exists()
        c = client(server.url)
        rec = read_json(run_dir / "mlflow.json")
        got = history(c, rec["run_id"], "val_accuracy")
        rows = epochs(run_dir / "train" / "metrics.jsonl")
        assert got == sorted((row["step"], row["val_accuracy"]) for row in rows.values())
        (mv,) = c.search_model_versions("name='mldown'")
        assert c.get_registered_model("mldown").aliases == {"champion": mv.version}
    finally:
        stopped.set()
        server.stop()


def _xcoms(tmp_path: Path) -> list[tuple[str, str, Any]]:
    con = sqlite3.connect(tmp_path / "home" / "airflow" / "airflow.db")
    try:
        rows = con.execute(
            "SELECT task_id, run_id, value FROM xcom WHERE key = 'return_value'"
        ).fetchall()
    finally:
        con.close()
    out = []
    for task, run_id, value in rows:
        v = json.loads(value) if isinstance(value, str | bytes) else value
        out.append((task, run_id, json.loads(v) if isinstance(v, str) else v))
    return out


def xcom(tmp_path: Path, task: str) -> dict[str, Any]:
    (value,) = [v for t, _, v in _xcoms(tmp_path) if t == task]
    return value


def xcom_run_id(tmp_path: Path) -> str:
    (run_id,) = {r for _, r, _ in _xcoms(tmp_path)}
    return run_id
