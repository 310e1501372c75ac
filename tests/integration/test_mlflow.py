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

# three `dagtrain run`s in the test (each starts an embedded Airflow): more than the
# suite's 300 s default on a loaded machine; each run has its own deadline too
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def venv() -> Path:
    try:
        return server_venv()
    except CannotBuild as e:
        pytest.skip(f"no MLflow server on this machine: {e}")


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
    runs = tmp_path / "art" / name / "runs" / f"dagtrain_{name}"
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


def test_runs_retries_the_champion_alias_and_a_server_lost_mid_run_follow_dagtrain(
    tmp_path, venv, monkeypatch
):
    """Three runs of one pipeline against one server (three ``dagtrain run``s, where this
    module once had three tests and five runs; each item below was one of those tests):

    - the runs' metrics, params, test metrics and files, and the champion alias: a weak
      first model (v1, promoted: the first champion), a better one (v2, the alias moves),
      a weak one (v3, not promoted: the alias stays on v2);
    - a retried try logs into the same MLflow run: in the second run rank 1 fails once
      after its first epoch; try 2 resumes, and each epoch is in the run once;
    - a server stopped mid-run costs a warning naming the connection, never the model:
      the server is killed as the third run starts; the run trains, evaluates and keeps
      dagtrain's registry; what was not logged waits in the run's folder, and the train
      task's XCom and the promote task's skip reason say so; with the server back (the
      same store) a stage of the run logs what was missed, and the version and the alias
      are then as if nothing had happened.
    """
    server = MlflowServer(venv, tmp_path / "mlflow").start()
    marker = tmp_path / "failed-once"
    # rank 1's 30th forward: in the 3-epoch run's second epoch (an epoch is 20 steps and a
    # validation pass), never in a 1-epoch run
    cfg = write_config(
        tmp_path,
        "mlf",
        "data: {source: digits}\n"
        f"model: {{name: 'tests.unit.training.factory:fail_once', "
        f"args: {{marker: '{marker}', at_call: 30}}}}\n"
        "training: {epochs: 2, batch_size: 64, lr: 0.1, retries: 1, retry_delay_seconds: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\n",
    )
    weak = ("training.lr=0.002", "training.epochs=1")
    stopped = threading.Event()

    def stop_once_the_third_run_is_recorded() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not stopped.is_set():
            if len(list((tmp_path / "art").glob("mlf/runs/*/*/mlflow.json"))) == 3:
                server.stop(kill=True)  # before any rank starts: every epoch is missed
                stopped.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=stop_once_the_third_run_is_recorded, daemon=True)
    try:
        r = dagtrain_run(tmp_path, cfg, server.url, *weak)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not marker.exists() and "try 2" not in r.stdout  # one epoch: no fault
        r = dagtrain_run(tmp_path, cfg, server.url, "training.epochs=3")
        assert r.returncode == 0, r.stdout + r.stderr
        assert marker.exists()  # try 1 did fail
        assert "train started (try 2)" in r.stdout
        watcher.start()
        r = dagtrain_run(tmp_path, cfg, server.url, *weak)
        stopped.set()
        watcher.join(10)
        assert r.returncode == 0, r.stdout + r.stderr
        runs = run_dirs(tmp_path, "mlf")
        assert len(runs) == 3
        reg = read_json(tmp_path / "art" / "mlf" / "registry" / "registry.json")
        assert [v["promoted"] for v in reg["versions"]] == [True, True, False]
        assert reg["champion"] == 2

        # the third run: trained and kept by dagtrain; what MLflow missed is pending
        values = return_values(tmp_path, "dagtrain_mlf")
        third = run_id_of(values, runs[2])
        logs = tmp_path / "home" / "logs"
        texts = {}
        for task in ("train", "evaluate", "promote"):
            (log,) = list(logs.rglob(f"run_id={third}/task_id={task}/attempt=1.log"))
            text = texts[task] = log.read_text()
            assert text.count(f"MLflow tracking: connection '{CONN}'") == 1, (task, text[-3000:])
        pending = [i["part"] for i in read_json(runs[2] / "mlflow-pending.json")["pending"]]
        assert {"train", "evaluate", "promote"} <= set(pending), pending
        train_xcom = values[third]["train"]
        assert train_xcom["tracking"]["ok"] is False
        assert train_xcom["tracking"]["connection"] == CONN
        assert train_xcom["tracking"]["error"]
        # not promoted: a skipped task has no XCom; its reason says MLflow failed too
        skipped = (
            f"not promoted: test accuracy {reg['versions'][2]['metrics']['test_accuracy']:.4f}"
        )
        assert skipped in texts["promote"] and f"MLflow ('{CONN}') failed" in texts["promote"]
        assert len(epochs(runs[2] / "train" / "metrics.jsonl")) == 1

        # the server back (the same store): a stage of the run does what was missed
        server = MlflowServer(venv, tmp_path / "mlflow", port=server.port).start()
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", server.url)
        from dagtrain.config import load_config
        from dagtrain.phases.registry import tracker_of

        # what a stage of the run tags with (DagtrainOperator.airflow_run): the missed
        # start (the server was killed as it began) is done with it
        page = f"http://localhost:8080/dagtrain/?dag_id=dagtrain_mlf&run_id={quote(third, safe='')}"
        airflow = {"dag_id": "dagtrain_mlf", "run_id": third, "try_number": 1, "page": page}
        tracker = tracker_of(load_config(cfg), third, airflow, None)
        assert tracker.report()["ok"] and not (runs[2] / "mlflow-pending.json").exists()

        c = client(server.url)
        for run_dir in runs:
            assert_run_matches(c, run_dir, "mlf")
        assert read_json(runs[1] / "train" / "config.json")["training"]["epochs"] == 3
        # the retried run: one MLflow run, try 2's, each of its three epochs once
        retried = c.get_run(read_json(runs[1] / "mlflow.json")["run_id"])
        assert retried.data.tags["airflow.try_number"] == "2"
        assert len(epochs(runs[1] / "train" / "metrics.jsonl")) == 3
        assert retried.info.status == "FINISHED"

        versions = {mv.tags["dagtrain.version"]: mv for mv in c.search_model_versions("name='mlf'")}
        assert sorted(versions) == ["1", "2", "3"]  # every challenger a version
        for v in reg["versions"]:
            mv = versions[str(v["version"])]
            verdict = "promoted" if v["promoted"] else "not promoted"
            assert mv.tags["dagtrain.verdict"] == verdict
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
        airflow_run = c.get_run(rec["run_id"]).data.tags["airflow.run_id"]
        link = report.run_report(root, "dagtrain_mlf", airflow_run, [], None, None)["mlflow"]
        want = f"{server.url}/#/experiments/{rec['experiment_id']}/runs/{rec['run_id']}"
        assert link["url"] == want
        assert link["pending"] is False
    finally:
        stopped.set()
        server.stop()


# the return values of a DAG's runs, through Airflow's own models, in a process of the
# home `dagtrain run` used (the test's process has an Airflow of its own)
RETURN_VALUES = """
import json, sys
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

dag_id, out = sys.argv[1], {}
with create_session() as session:
    for run in DagRun.find(dag_id=dag_id, session=session):
        q = XComModel.get_many(run_id=run.run_id, key="return_value", dag_ids=dag_id)
        out[run.run_id] = {x.task_id: XComModel.deserialize_value(x) for x in session.scalars(q)}
print(json.dumps(out))
"""


def return_values(tmp_path: Path, dag_id: str) -> dict[str, dict[str, Any]]:
    """{Airflow run id: {task id: its XCom return value}} of ``dag_id``'s runs."""
    from dagtrain.cli.embedded import Home

    env = {**os.environ, **Home(tmp_path / "home", tmp_path / "dags").environment()}
    r = subprocess.run(
        [sys.executable, "-c", RETURN_VALUES, dag_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def run_id_of(values: dict[str, dict[str, Any]], run_dir: Path) -> str:
    """The Airflow run id of the run whose artifacts are ``run_dir``."""
    from dagtrain.records.layout import safe_name

    (run_id,) = {r for r in values if safe_name(r) == run_dir.name}
    return run_id
