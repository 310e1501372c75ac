"""dagtrain run's summary says where the run and the champion are in MLflow, from the
records the stages wrote, and that nothing was logged when the server was down."""

from __future__ import annotations

import json

from dagtrain.cli.run import _mlflow_lines
from dagtrain.config import load_config
from dagtrain.records.layout import ArtifactLayout
from dagtrain.records.registry import RegistryEntry


def cfg_of(tmp_path, tracking: str):
    p = tmp_path / "p.yaml"
    p.write_text(f"name: p\nartifacts: {{root: art}}\n{tracking}")
    return load_config(p)


def test_the_run_and_the_champion_are_linked(tmp_path):
    cfg = cfg_of(tmp_path, "tracking: {}\n")
    lay = ArtifactLayout.of(cfg)
    run = lay.run("r1").dir
    run.mkdir(parents=True)
    uri = "http://mlflow:5000"
    (run / "mlflow.json").write_text(
        json.dumps({"uri": uri, "experiment_id": "3", "run_id": "abc", "experiment": "p"})
    )
    lay.registry.mkdir(parents=True)
    (lay.registry / "mlflow.json").write_text(
        json.dumps({"uri": uri, "versions": {"2": {"name": "p", "version": "5"}}})
    )
    assert _mlflow_lines(cfg, run, RegistryEntry(2, "m.pt")) == [
        f"MLflow run: {uri}/#/experiments/3/runs/abc",
        f"MLflow champion: p v5 {uri}/#/models/p/versions/5",
    ]


def test_a_run_that_logged_nothing_says_so_and_no_tracking_says_nothing(tmp_path):
    cfg = cfg_of(tmp_path, "tracking: {connection: ml}\n")
    lines = _mlflow_lines(cfg, ArtifactLayout.of(cfg).run("r1").dir, None)
    assert lines == [
        "MLflow: nothing logged: connection 'ml' failed (its warning is in the task logs)"
    ]
    assert _mlflow_lines(cfg_of(tmp_path, ""), tmp_path, None) == []
