"""Artifact files: atomic writes, checksums, the layout of a pipeline's artifact root.

::

    <root>/<pipeline>/
      data/<version>/        train.npz val.npz test.npz shard-00.npz ... manifest.json
      runs/<run>/train/      checkpoints/ (ckpt-*.pt + sidecars), result.json, traces/
      runs/<run>/rounds/     global/ (ckpt-<round>.pt), round-01/shard-00/delta.pt ...
      runs/<run>/eval.json
      registry/              registry.json, models/v0001/model.pt (+ .json sidecar)

Everything is written to a temporary name, fsynced and renamed, so a reader sees a
whole file or none. No torch here: operators use it at parse time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from dagtrain.atomic import atomic_write
from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError, MissingDependency

__all__ = [
    "append_json_line",
    "atomic_write",
    "check_source",
    "read_json",
    "run_dir",
    "safe_name",
    "sha256_file",
    "write_json",
]


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def append_json_line(path: str | Path, obj: Any) -> None:
    """Append ``obj`` as one JSON line, with a single ``write`` on an ``O_APPEND``
    descriptor: concurrent writers never interleave, a reader never sees half a line."""
    line = (json.dumps(obj, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def safe_name(s: str) -> str:
    """A run id (``manual__2026-11-30T04:32:18+00:00``) as one safe path component."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("._") or "run"


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / safe_name(run_id)


SUFFIXES = (".npz", ".npy", ".csv", ".parquet")


def check_source(cfg: PipelineConfig) -> str:
    """``data.source`` resolved (``digits``, or a path), after checking that the file is
    there, readable and of a kind the data layer reads; InputError names the field."""
    src = cfg.data_source()
    if src == "digits":
        return src
    how = (
        "give 'digits' or a .npz/.npy/.csv/.parquet file (a relative path is relative "
        "to the config file)"
    )
    if Path(src).is_dir():
        raise InputError(f"data.source {cfg.data.source!r}: {src} is a directory; {how}")
    if not Path(src).is_file():
        raise InputError(f"data.source {cfg.data.source!r}: no such file ({src}); {how}")
    if not os.access(src, os.R_OK):
        raise InputError(f"data.source {cfg.data.source!r}: {src} is not readable by this user")
    if Path(src).suffix.lower() not in SUFFIXES:
        raise InputError(f"data.source {cfg.data.source!r}: unknown kind of file; {how}")
    if Path(src).suffix.lower() == ".parquet":
        import importlib.util

        lacking = [m for m in ("pandas", "pyarrow") if importlib.util.find_spec(m) is None]
        if lacking:
            raise MissingDependency(
                f"data.source {cfg.data.source!r}: reading parquet needs pandas and pyarrow; "
                f"not installed in this environment ({sys.prefix}): {', '.join(lacking)}. "
                "pip install pandas pyarrow, or convert the file to .npz/.csv"
            )
    return src
