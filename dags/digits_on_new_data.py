"""Retraining when new data arrives: this Airflow DAG runs whenever the Asset named in
digits_on_new_data.yaml (schedule.asset) gets an event, e.g. from an ingest DAG's
outlet or `POST /api/v2/assets/events`."""

from pathlib import Path

from dagtrain.pipelines import retraining_dag

dag = retraining_dag(Path(__file__).with_suffix(".yaml"))
