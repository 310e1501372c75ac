"""A task finds its run's folder through its own DAG: two DAGs built from one config
(a DAG file with its own ``dag_id`` beside the generated one) share the pipeline's data
and registry, never a run's folder, whatever run id a triggering user chooses."""

from __future__ import annotations

from types import SimpleNamespace

from dagtrain.operators import DataPrepOperator
from dagtrain.pipelines import retraining_dag
from dagtrain.records.layout import ArtifactLayout


def test_each_dag_of_one_config_has_its_own_run_folders(tmp_path):
    config = tmp_path / "p.yaml"
    config.write_text(f"name: p\nartifacts: {{root: {tmp_path / 'art'}}}\n")
    generated, own = retraining_dag(config), retraining_dag(config, dag_id="p_hourly")
    assert (generated.dag_id, own.dag_id) == ("dagtrain_p", "p_hourly")
    run_id = "scheduled__2026-01-05T00:00:00+00:00"  # chosen by whoever triggers
    folders = {}
    for dag in (generated, own):
        op = dag.get_task("train")
        ctx = {"run_id": run_id, "dag": dag, "dag_run": SimpleNamespace(conf={})}
        lay = ArtifactLayout.of(op.run_config(ctx))
        folders[dag.dag_id] = lay.run(run_id).dir
        assert lay.registry == tmp_path / "art" / "p" / "registry"  # the pipeline's
    assert folders["dagtrain_p"] != folders["p_hourly"]
    assert folders["p_hourly"].parent == tmp_path / "art" / "p" / "runs" / "p_hourly"
    assert isinstance(generated.get_task("prepare_data"), DataPrepOperator)
