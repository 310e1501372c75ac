"""Round-based low-communication training (local SGD / DiLoCo) as an Airflow DAG built
from digits_rounds.yaml: each round maps a training task over the data's shards, and a
RoundAveragingOperator closes it (check every shard, average the deltas, outer Nesterov
step)."""

from pathlib import Path

from dagtrain.pipelines import rounds_dag

dag = rounds_dag(Path(__file__).with_suffix(".yaml"))
