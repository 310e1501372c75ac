"""Checkpoints: atomic, checksummed, the last K kept, the newest valid one found.

Layout of a checkpoint directory::

    ckpt-00000120.pt          torch.save of the state (tensors, dicts, numbers)
    ckpt-00000120.pt.json     {"step": 120, "sha256": "...", "bytes": 123456}

Both files are written to a temporary name, fsynced, then renamed; the sidecar comes
last, so a checkpoint without a sidecar (a crash in between) or whose bytes do not
match it (truncated, corrupted) is skipped with a warning, and the previous one used.
Loading uses ``torch.load(weights_only=True)``: a checkpoint holds no code.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from dagtrain.atomic import atomic_write, fsync_dir
from dagtrain.errors import InputError
from dagtrain.records.names import CHECKPOINT, SIDECAR

__all__ = ["latest", "load", "save", "state_digest"]

log = logging.getLogger(__name__)


def save(
    state: dict[str, Any],
    directory: str | os.PathLike,
    step: int,
    keep: int = 3,
    protect: int | None = None,
) -> Path:
    """Write ``state`` as the checkpoint of ``step``; keep the newest ``keep``, and the
    checkpoint of step ``protect`` (early stopping's best epoch) whatever its age."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, not {keep}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for stale in d.glob(".ckpt-*"):  # temp files of a writer killed mid-write (one
        stale.unlink(missing_ok=True)  # writer per directory: rank 0, one at a time)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = d / CHECKPOINT(step=step)
    atomic_write(path, data)
    meta = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    atomic_write(_sidecar(path), json.dumps(meta).encode())
    fsync_dir(d)
    for old in _steps(d)[:-keep]:
        if old == protect:
            continue
        p = d / CHECKPOINT(step=old)
        _sidecar(p).unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    return path


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a model state (names and bytes, in name order): equal digests,
    bitwise-equal models."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _steps(d: Path) -> list[int]:
    if not d.is_dir():
        return []
    return sorted(m["step"] for p in d.iterdir() if (m := CHECKPOINT.match(p.name)))


def _sidecar(path: Path) -> Path:
    return path.with_name(SIDECAR(name=path.name))


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Load one checkpoint after checking it against its sidecar; raise ValueError if bad."""
    path = Path(path)
    side = _sidecar(path)
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path.name}: no valid sidecar {side.name} ({e})") from e
    data = path.read_bytes()
    if len(data) != meta.get("bytes") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise InputError(f"{path.name}: checksum mismatch (truncated or corrupted)")
    try:
        # map_location: a GPU run's checkpoint loads anywhere (load_state_dict then
        # copies it to the model's device)
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # torch's message advises weights_only=False: never do that
        raise InputError(
            f"{path.name} is not a dagtrain checkpoint: it holds no tensors and plain data "
            f"that torch.load(weights_only=True) reads ({type(e).__name__})"
        ) from e
    if not isinstance(state, dict):
        raise InputError(f"{path.name} is not a dagtrain checkpoint: it holds no dict of states")
    return state


def latest(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads and matches its checksum, or None."""
    d = Path(directory)
    for step in reversed(_steps(d)):
        path = d / CHECKPOINT(step=step)
        try:
            return path, load(path)
        except Exception as e:  # any unreadable checkpoint is skipped
            log.warning("skipping checkpoint %s: %s; trying the previous one", path, e)
    return None
