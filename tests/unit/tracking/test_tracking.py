"""dagtrain.tracking without a server: refusals before any work, the connection read as
a tracking URI, params flattened, and the page's links from the records."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError, MissingDependency
from dagtrain.tracking import check_tracking, mlflow_links, require_client, tracking_uri
from dagtrain.tracking.tracker import params_of


def tracked(**tracking) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "p", "tracking": tracking})


def test_no_tracking_section_needs_nothing():
    assert check_tracking(PipelineConfig.model_validate({"name": "p"})) is None


def test_a_missing_client_is_refused_saying_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a)
    )
    with pytest.raises(
        MissingDependency, match=r"pip install 'airflow-provider-dagtrain\[mlflow\]'"
    ):
        require_client(tracked())


def test_an_unknown_connection_is_refused_naming_the_field(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_MLFLOW", raising=False)
    with pytest.raises(
        InputError, match=r"tracking.connection: there is no Airflow connection 'no_such_mlflow'"
    ):
        check_tracking(tracked(connection="no_such_mlflow"))


@pytest.mark.parametrize(
    ("conn", "uri"),
    [
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://mlflow.example.com", "https://mlflow.example.com"),
        ('{"conn_type": "http", "host": "mlflow", "port": 5000}', "http://mlflow:5000"),
        ('{"conn_type": "http", "host": "http://mlflow:5000/"}', "http://mlflow:5000"),
        ('{"conn_type": "http", "host": "m", "schema": "https", "port": 8443}', "https://m:8443"),
    ],
)
def test_the_connection_s_host_schema_and_port_are_the_tracking_uri(monkeypatch, conn, uri):
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEST", conn)
    assert tracking_uri("mlflow_test") == uri


def test_a_connection_without_host_is_refused(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_EMPTY", '{"conn_type": "http"}')
    with pytest.raises(
        InputError, match=r"tracking\.connection: Airflow connection 'mlflow_empty' has no host"
    ):
        tracking_uri("mlflow_empty")


def test_params_are_dotted_keys_with_json_values():
    cfg = {"training": {"lr": 0.1, "epochs": 3}, "model": {"name": "mlp", "args": {"hidden": [16]}}}
    assert params_of(cfg) == {
        "training.lr": "0.1",
        "training.epochs": "3",
        "model.name": "mlp",
        "model.args": '{"hidden": [16]}',
    }


def test_links_come_from_the_records_and_only_for_http(tmp_path):
    run, reg = tmp_path / "run", tmp_path / "registry"
    run.mkdir()
    reg.mkdir()
    rec = {"uri": "http://m:5000", "experiment_id": "3", "run_id": "abc", "experiment": "p"}
    (run / "mlflow.json").write_text(json.dumps(rec))
    (reg / "mlflow.json").write_text(
        json.dumps(
            {"uri": "http://m:5000", "versions": {"2": {"name": "my model", "version": "5"}}}
        )
    )
    links = mlflow_links(run, reg)
    assert links["run"]["url"] == "http://m:5000/#/experiments/3/runs/abc"
    assert links["run"]["pending"] is False
    assert links["versions"]["2"]["url"] == "http://m:5000/#/models/my%20model/versions/5"
    (run / "mlflow.json").write_text(json.dumps(rec | {"uri": "javascript:alert(1)"}))
    assert mlflow_links(run, None)["run"] is None
    assert mlflow_links(tmp_path / "none", tmp_path / "none") == {"run": None, "versions": {}}


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("http://u:p@mlflow:5000", "http://mlflow:5000"),
        (
            "https://b.s3.amazonaws.com/d.csv?X-Amz-Signature=s",
            "https://b.s3.amazonaws.com/d.csv?***",
        ),
        ("s3://bucket/d.csv", "s3://bucket/d.csv"),
        ("digits", "digits"),
        ("pkg.mod:build", "pkg.mod:build"),
        ("http://u@[::1]:80/x?a=1#f", "http://[::1]:80/x?***#f"),
    ],
)
def test_a_url_is_recorded_without_its_user_password_and_query(raw, shown):
    from dagtrain import redact

    assert redact.url(raw) == shown


def test_a_tracking_uri_with_a_password_is_never_recorded_or_reported(monkeypatch, tmp_path):
    """The server is down (a closed port): the XCom's ``uri`` and ``error``, the warning
    and the run's record hold the URI without its user and password. Also: MLflow's
    deadlines and the quieted retry warnings hold for dagtrain's calls only (the
    process's environment and urllib3's logger are as they were after)."""
    pytest.importorskip("mlflow")
    import logging
    import os
    import socket

    from dagtrain.tracking import Tracker
    from dagtrain.tracking.tracker import DEADLINES

    for k in DEADLINES:
        monkeypatch.delenv(k, raising=False)
    filters = list(logging.getLogger("urllib3.connectionpool").filters)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    # the user and password in the host field (a connection URI's own would be parsed
    # into its login and password, which the tracking URI does not use)
    host = f"http://alice:s3cret@127.0.0.1:{port}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLFLOW_SECRET", json.dumps({"conn_type": "http", "host": host})
    )
    log = logging.getLogger("test-tracking-secret")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log.addHandler(handler)
    retries = []
    urllib3_handler = logging.Handler()
    urllib3_handler.emit = retries.append
    logging.getLogger("urllib3.connectionpool").addHandler(urllib3_handler)
    t = Tracker(tracked(connection="mlflow_secret"), tmp_path / "run", tmp_path / "reg", log=log)
    try:
        assert t.do("start") is False
    finally:
        logging.getLogger("urllib3.connectionpool").removeHandler(urllib3_handler)
        log.removeHandler(handler)
    report = t.report()
    text = json.dumps(report) + " ".join(r.getMessage() for r in records)
    text += "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert report["uri"] == f"http://127.0.0.1:{port}" and report["error"], report
    assert "s3cret" not in text and "alice" not in text, text
    # one warning, dagtrain's, naming the connection; not urllib3's retry line too
    assert retries == [], retries
    assert not [k for k in DEADLINES if k in os.environ]
    assert logging.getLogger("urllib3.connectionpool").filters == filters
    (warning,) = [r.getMessage() for r in records]
    assert warning.startswith("MLflow tracking: connection 'mlflow_secret'") and (
        "failed in start" in warning
    ), warning


class _Client:
    """MLflow's client as the tracker calls it, keeping what is logged."""

    def __init__(self):
        from types import SimpleNamespace

        self.ns = SimpleNamespace
        self.metrics: list = []
        self.tags: dict = {}
        self.versions: list = []

    def get_experiment_by_name(self, name):
        return self.ns(experiment_id="1")

    def search_runs(self, *a, **k):
        return []

    def create_run(self, *a, **k):
        return self.ns(info=self.ns(run_id="r1"))

    def get_run(self, run):
        return self.ns(data=self.ns(params={}), info=self.ns(artifact_uri="mem://a"))

    def get_metric_history(self, run, key):
        return []

    def log_batch(self, run, metrics=(), params=(), tags=()):
        self.metrics += list(metrics or ())
        self.tags |= {t.key: t.value for t in tags or ()}

    def create_model_version(self, name, source, run_id=None, tags=None, **k):
        self.versions.append(dict(tags or {}))
        return self.ns(version=len(self.versions))

    def log_artifact(self, *a, **k):
        pass

    log_artifacts = log_artifact


def test_every_metric_of_an_objective_reaches_mlflow(monkeypatch, tmp_path):
    """A regression's epoch rows and a language model's evaluation: each metric and sum
    is logged (mse, mae, r2, perplexity: no name is singled out), an epoch's at its step."""
    pytest.importorskip("mlflow")
    from dagtrain.tracking import Tracker

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_FAKE", "http://127.0.0.1:9")
    t = Tracker(tracked(connection="mlflow_fake"), tmp_path / "run", tmp_path / "reg")
    t._client = client = _Client()
    train = tmp_path / "run" / "train"
    train.mkdir(parents=True)
    row = {"kind": "epoch", "epoch": 0, "step": 10, "total_steps": 10, "time": 1.0}
    row |= {"train_loss": 900.0, "train_mse": 900.0, "train_mae": 25.0, "train_r2": 0.1}
    row |= {"val_loss": 950.0, "val_mse": 950.0, "val_mae": 26.0, "val_r2": 0.05}
    row |= {"val_abs_error": 2288.0, "val_target_sum": 13631, "val_units": 88}
    row |= {"lr": 0.003, "grad_norm": 1.7, "clip_rate": 0.25}  # the recipe's, per epoch
    (train / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    assert t.do("train", train_dir=str(train)) is True
    logged = {m.key: (m.value, m.step) for m in client.metrics}
    recipe = ("lr", "grad_norm", "clip_rate")
    for k in (
        "train_mse",
        "train_mae",
        "train_r2",
        "val_mse",
        "val_mae",
        "val_r2",
        "val_units",
        *recipe,
    ):
        assert logged[k] == (float(row[k]), 10), k
    assert not {"kind", "time", "total_steps"} & set(logged)
    tested = {"test_loss": 2.1, "test_perplexity": 8.17, "test_accuracy": 0.3}
    tested |= {"test_correct": 78, "test_units": 260}
    evaluation = tmp_path / "run" / "eval.json"
    evaluation.write_text(json.dumps({"checkpoint": "c.pt", "metrics": tested, "reason": "x"}))
    client.metrics = []
    assert t.do("evaluate", evaluation=str(evaluation)) is True
    assert {m.key: m.value for m in client.metrics} == {k: float(v) for k, v in tested.items()}


def test_a_warm_start_is_tagged_on_the_run_and_on_its_model_version(monkeypatch, tmp_path):
    """The training's start (its summary's ``init``) is the run's ``dagtrain.init`` tag
    (and ``dagtrain.init_version``, the champion's), and the registered model version's,
    from the registry entry's lineage."""
    pytest.importorskip("mlflow")
    from dagtrain.records.registry import RegistryEntry
    from dagtrain.tracking import Tracker

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_FAKE", "http://127.0.0.1:9")
    t = Tracker(tracked(connection="mlflow_fake"), tmp_path / "run", tmp_path / "reg")
    t._client = client = _Client()
    train = tmp_path / "run" / "train"
    train.mkdir(parents=True)
    init = {"kind": "champion", "version": 3, "path": "/r/models/v0003/model.pt", "note": None}
    summary = {"rank": 0, "world": 1, "backend": "local", "steps": 5, "init": init}
    (train / "result.json").write_text(json.dumps(summary))
    assert t.do("train", train_dir=str(train)) is True
    assert client.tags["dagtrain.init"] == "champion v3"
    assert client.tags["dagtrain.init_version"] == "3"
    model = tmp_path / "model.pt"
    model.write_bytes(b"x")
    entry = RegistryEntry(4, str(model), lineage={"init": init}, reason="better")
    t._register("r1", entry)
    assert client.versions[-1]["dagtrain.init"] == "champion v3"
    scratch = RegistryEntry(5, str(model), lineage={"run_id": "x"}, reason="r")
    t._register("r1", scratch)
    assert "dagtrain.init" not in client.versions[-1]
