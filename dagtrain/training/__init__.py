"""dagtrain.training: data-parallel training on the op-level executor.

``train(config)`` is one rank's run; ``run_training(config)`` launches all of them.
Imports torch: operator modules and DAG files import it inside ``execute()`` only.
"""

from __future__ import annotations

from dagtrain.config import TrainConfig

from .job import run_training
from .trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "run_training", "train"]
