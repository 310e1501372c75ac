"""dagtrain's Airflow operators. Thin: they validate and delegate to dagtrain.phases,
which imports torch only inside ``execute`` (Airflow parses DAG files again and again)."""

from .data_prep import DataPrepOperator
from .evaluate import EvaluateOperator, PromoteOperator
from .round_averaging import RoundAveragingOperator
from .train import DistributedTrainOperator

__all__ = [
    "DataPrepOperator",
    "DistributedTrainOperator",
    "EvaluateOperator",
    "GradientSyncOperator",
    "PromoteOperator",
    "RoundAveragingOperator",
]

# the name this operator had at first, kept for DAG files written against it
GradientSyncOperator = RoundAveragingOperator
