"""Where a run's initial weights come from: ``training.init`` (``scratch``, the
registry's champion, resolved by the train phase into ``init_from``, or a model file)
and round-based training's global model (``init_from``).

A warm start takes the model's weights only: the optimizer's state (momentum, Adam's
moments), the LR schedule and the step count start fresh. The weights must fit the
model the config builds, parameter by parameter (same names, same shapes): the train
phase checks that before any rank starts (:func:`check_fits`), and every rank checks it
again before it loads them, so a run started some other way fails as clearly.

What a model file may be (:func:`load_weights`): a dagtrain checkpoint or a registry
model file (checked against its sha256 sidecar when one is beside it), or a plain
``torch.save(model.state_dict(), path)``; a dict with a ``"model"`` entry, or a state
dict itself. It is read with ``torch.load(weights_only=True)``: it holds no code.
The file is mapped rather than loaded (``mmap``; a file of torch's older format, not a
zip, is loaded): its shapes are checked without its tensors in memory, and a pipeline
rank brings into memory only its own stage's tensors, which it copies into its model;
none of the loaded tensors is kept. A pipeline's sharded checkpoint is not mapped (its
tensors are in DCP folders): a rank reads its own stage's tensors, the others' shapes
come from the folders' metadata. (A file with a sidecar is still read once through
for its checksum, every shard of a sharded checkpoint included.)
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dagtrain.config import INIT_KINDS, TrainConfig
from dagtrain.errors import InputError
from dagtrain.records.names import SIDECAR

from . import checkpoint
from .stages import load_own, own_state

__all__ = ["check_fits", "init_field", "initial_weights", "load_weights", "shapes_of"]

FIELD = "training.init"
_SCRATCH = "set training.init: scratch for a new architecture"


def init_field(cfg: TrainConfig) -> str:
    """The field a problem with the run's initial weights is said of: ``training.init``
    for a warm start, ``init_from`` for round-based training's global model."""
    return "init_from" if cfg.training.init == "scratch" else FIELD


def load_weights(
    path: str | Path, field: str = FIELD, read: set[str] | None = None
) -> dict[str, torch.Tensor]:
    """The model state in ``path``: a dagtrain checkpoint or registry model file (its
    sidecar checked when it has one), or a plain ``torch.save(state_dict)``; the
    ``"model"`` entry of a dict that has one, else the dict itself. Never an optimizer's
    state. ``read``: of a sharded checkpoint's tensors, only these are read, the others
    are meta tensors (:func:`.checkpoint.load`). InputError naming ``field`` for a
    missing, corrupt or foreign file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"{field}: there is no model file {str(p)!r}; name a model file (a registry "
            "model.pt, a dagtrain checkpoint, or a torch.save(model.state_dict())) or set "
            "training.init: scratch"
        )
    if p.with_name(SIDECAR(name=p.name)).exists():
        try:
            # (its checksum verified; a file of torch's older format cannot be mapped)
            state: Any = checkpoint.load(p, mmap=True, optim=False, read=read)
        except InputError as e:
            raise InputError(
                f"{field}: {e}; use an intact copy or set training.init: scratch"
            ) from e
    else:
        try:
            state = torch.load(p, weights_only=True, map_location="cpu", mmap=zipfile.is_zipfile(p))
        except Exception as e:  # torch advises weights_only=False: never
            raise InputError(
                f"{field}: {p.name} is not a model file torch.load(weights_only=True) reads "
                f"({type(e).__name__}); save one with torch.save(model.state_dict(), path)"
            ) from e
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):
        state = state["model"]
    if (
        not isinstance(state, Mapping)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise InputError(
            f"{field}: {p.name} holds neither a model's state dict nor a checkpoint with a "
            "'model' entry; save one with torch.save(model.state_dict(), path)"
        )
    return dict(state)


def shapes_of(state: Mapping[str, Any] | nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter and buffer name -> shape (a module's, on any device, meta included)."""
    if isinstance(state, nn.Module):
        state = state.state_dict()
    return {k: tuple(v.shape) for k, v in state.items()}


def check_fits(
    state: Mapping[str, Any],
    model: Mapping[str, Any] | nn.Module,
    source: str,
    model_name: str = "model.name",
    field: str = FIELD,
) -> None:
    """InputError naming ``field`` and ``source`` (``champion v3``, ``file 'a.pt'``)
    unless ``state``'s entries are ``model``'s (a module, or its shapes), by name and
    shape: which parameter differs, both shapes, and what to do."""
    have, want = shapes_of(state), shapes_of(model)
    head = f"{field} {source}: its weights do not fit the model this config builds ({model_name})"
    missing = [k for k in want if k not in have]
    extra = [k for k in have if k not in want]
    if missing or extra:
        said = []
        if missing:
            said.append(f"it lacks {_names(missing)}")
        if extra:
            said.append(f"it has {_names(extra)} the model does not")
        raise InputError(f"{head} ({'; '.join(said)}); {_SCRATCH}")
    for k, shape in want.items():
        if have[k] != shape:
            raise InputError(
                f"{head}: parameter {k!r} is {list(have[k])} there and {list(shape)} in "
                f"this config's model; {_SCRATCH}"
            )


def _names(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def source_of(cfg: TrainConfig) -> str | None:
    """The file the run's initial weights come from: ``init_from`` (the train phase's
    resolution of ``training.init``, or a round's global model), else a file that
    ``training.init`` names; None for scratch."""
    if cfg.init_from:
        return cfg.init_from
    return None if cfg.training.init in INIT_KINDS else cfg.training.init


def initial_weights(cfg: TrainConfig, model: nn.Module) -> None:
    """Load the run's initial weights into ``model`` (nothing for ``scratch``), after
    checking that they fit it (InputError naming ``training.init`` otherwise). The
    optimizer's state is never taken from them."""
    source = source_of(cfg)
    if cfg.training.init == "champion" and not source:
        # the train phase gives a pipeline's ranks the champion's file (or scratch)
        raise InputError(
            "training.init champion: a training run alone has no model registry to take "
            "the champion from; run it as a pipeline (dagtrain run, or its DAG), or name a "
            "model file in training.init"
        )
    if not source:
        return
    field = init_field(cfg)
    # a pipeline rank reads its own stage's tensors of a sharded checkpoint (the
    # others' shapes from its metadata)
    state = load_weights(source, field, read=set(own_state(model)))
    said = (
        "champion"
        if cfg.training.init == "champion"
        else f"file {Path(source).name!r}"
        if field == FIELD
        else f"global model {Path(source).name!r}"
    )
    check_fits(state, model, said, repr(cfg.model.name), field)
    load_own(model, state, said)  # (a pipeline rank: its stage's tensors)
