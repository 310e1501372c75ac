"""Pipeline-parallel retraining (an Airflow DAG built from transformer_pipeline.yaml
beside it): prepare_data -> train (a transformer split into 2 stages, 4 microbatches
a step) -> evaluate -> promote if better. Manual runs only."""

from pathlib import Path

from dagtrain.pipelines import retraining_dag

dag = retraining_dag(Path(__file__).with_suffix(".yaml"))
