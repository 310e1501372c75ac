"""Scheduled retraining (an Airflow DAG built from digits_retraining.yaml beside it):
prepare_data -> train (2 MPI ranks) -> evaluate -> promote if better, daily,
catchup off, one run at a time."""

from pathlib import Path

from dagtrain.pipelines import retraining_dag

dag = retraining_dag(Path(__file__).with_suffix(".yaml"))
