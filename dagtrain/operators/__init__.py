"""dagtrain's Airflow operators. Thin: they validate and delegate to the pipeline layer,
which imports torch only inside ``execute`` (DAG files are parsed every few seconds)."""

from .data_prep import DataPrepOperator
from .evaluate import EvaluateOperator, PromoteOperator
from .gradient_sync import GradientSyncOperator
from .train import DistributedTrainOperator

__all__ = [
    "DataPrepOperator",
    "DistributedTrainOperator",
    "EvaluateOperator",
    "GradientSyncOperator",
    "PromoteOperator",
]
