"""Regression retrained through Airflow (built from diabetes_regression.yaml beside
it): prepare_data -> train (an MLP on 2 ranks) -> evaluate (test MSE) -> promote if
lower. Manual runs only."""

from pathlib import Path

from dagtrain.pipelines import retraining_dag

dag = retraining_dag(Path(__file__).with_suffix(".yaml"))
