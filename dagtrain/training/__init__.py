"""dagtrain.training: data-parallel and pipeline-parallel training on the op-level
executor, in two rooms: :mod:`.rank`, what runs inside a rank (``train(config)`` is one
rank's run), and :mod:`.driver`, what starts and watches ranks (``run_training(config)``
launches all of them). The rank side never imports the driver
(``tests/unit/test_layers.py``).

Imports torch: operator modules and DAG files import it inside ``execute()`` only.
"""

from __future__ import annotations

from dagtrain.config import TrainConfig
from dagtrain.records.result import TrainResult

from .driver.job import run_training
from .rank.trainer import train

__all__ = ["TrainConfig", "TrainResult", "run_training", "train"]
