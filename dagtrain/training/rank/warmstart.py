"""Where a run's initial weights come from: ``training.init`` (``scratch``, the
registry's champion, resolved by the train phase into ``init_from``, or a model file)
and round-based training's global model (``init_from``)."""

from __future__ import annotations

from torch import nn

from dagtrain.config import INIT_KINDS, TrainConfig

from . import checkpoint

__all__ = ["initial_weights"]


def initial_weights(cfg: TrainConfig, model: nn.Module) -> None:
    """Load the run's initial weights into ``model`` (nothing for ``scratch``)."""
    source = cfg.init_from or (None if cfg.training.init in INIT_KINDS else cfg.training.init)
    if source:
        model.load_state_dict(checkpoint.load(source)["model"])
