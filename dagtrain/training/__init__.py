"""dagtrain.training: data-parallel training on the op-level executor.

Imports torch: operator modules and DAG files import it inside ``execute()`` only.
"""

from __future__ import annotations

from .config import TrainConfig
from .trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
