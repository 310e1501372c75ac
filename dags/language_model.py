"""A causal language model retrained through Airflow (built from language_model.yaml
beside it): prepare_data (a text cut into windows) -> train (a transformer split into 2
pipeline stages) -> evaluate (test perplexity) -> promote if lower. Manual runs only."""

from pathlib import Path

from dagtrain.pipelines import retraining_dag

dag = retraining_dag(Path(__file__).with_suffix(".yaml"))
