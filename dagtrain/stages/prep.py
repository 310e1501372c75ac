"""Data preparation: load, split (seeded), normalise with train statistics, shard, write.

The output is a versioned data directory: its version is a hash of the source's bytes
and of every setting that changes the arrays, so the same data and settings are
prepared once and every run that uses them shares them (and its lineage names them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError

from .files import (
    ArtifactLayout,
    DataFiles,
    atomic_write,
    check_source,
    read_json,
    sha256_file,
    shard_split,
    write_json,
)

__all__ = ["data_file", "manifest_of", "prepare", "prepare_stage", "verify_manifest"]


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _source_digest(cfg: PipelineConfig) -> str:
    src = check_source(cfg)
    if src == "digits":
        import sklearn

        return f"sklearn-digits-{sklearn.__version__}"
    return sha256_file(Path(src))


def prepare(cfg: PipelineConfig, shards: int = 0) -> dict[str, Any]:
    """Write train/val/test (and ``shards`` training shards); return the manifest."""
    from dagtrain.training.data import read_arrays, standardization

    d = cfg.data
    digest = _source_digest(cfg)
    key = json.dumps(
        {"source": digest, **d.model_dump(exclude={"source"}), "shards": shards},
        sort_keys=True,
    )
    version = hashlib.sha256(key.encode()).hexdigest()[:16]
    files_of = ArtifactLayout.of(cfg).data(version)
    out, manifest_path = files_of.dir, files_of.manifest
    if manifest_path.exists():
        try:
            return verify_manifest(manifest_path)
        except ValueError:
            pass  # damaged: prepare again, over it
    x, y, shape, classes = read_arrays(cfg.data_source())
    n = len(x)
    order = np.random.default_rng(d.seed).permutation(n)
    n_test, n_val = round(n * d.test_fraction), round(n * d.val_fraction)
    parts = {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }
    if len(parts["train"]) < shards:
        raise InputError(f"data: {len(parts['train'])} training samples for {shards} shards")
    xtr = x[parts["train"]]
    if d.normalize:
        mean, std = standardization(xtr)
    else:
        mean, std = np.zeros(x.shape[1:], np.float32), np.ones(x.shape[1:], np.float32)
    meta = {"in_shape": np.array(shape, np.int64), "classes": np.array(classes, np.int64)}
    files: dict[str, dict[str, Any]] = {}

    def put(name: str, idx: np.ndarray) -> None:
        xs = ((x[idx] - mean) / std).astype(np.float32)
        path = files_of.split(name)
        atomic_write(path, _npz_bytes(x=xs, y=y[idx], **meta))
        files[name] = {"path": path.name, "rows": len(idx), "sha256": sha256_file(path)}

    for name, idx in parts.items():
        put(name, idx)
    # shards: contiguous slices of a seeded shuffle of train (each sample in one shard)
    for k, idx in enumerate(np.array_split(parts["train"], shards) if shards else []):
        put(shard_split(k), idx)
    np_stats = _npz_bytes(mean=mean.astype(np.float32), std=std.astype(np.float32))
    atomic_write(files_of.stats, np_stats)
    manifest = {
        "version": version,
        "dir": str(out),
        "source": cfg.data.source,
        "source_digest": digest,
        "settings": d.model_dump(),
        "in_shape": list(shape),
        "classes": classes,
        "shards": shards,
        "files": files,
        "stats": {"path": files_of.stats.name, "sha256": sha256_file(files_of.stats)},
    }
    write_json(manifest_path, manifest)  # last: a manifest means the rest is complete
    return manifest


def verify_manifest(path: Path, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest, after checking the files ``names`` (default: all it lists) against
    their checksums: a task hashes only what it reads."""
    m = read_json(path)
    base = path.parent
    for name in m["files"] if names is None else names:
        f = m["files"].get(name)
        if f is None:
            raise InputError(f"data file {name} is not in {path} (its files: {sorted(m['files'])})")
        p = base / f["path"]
        if not p.exists() or sha256_file(p) != f["sha256"]:
            raise InputError(f"data file {name} ({p}) is missing or does not match its checksum")
    m["dir"] = str(base)
    return m


def data_file(manifest: dict[str, Any], name: str) -> str:
    return str(Path(manifest["dir"]) / manifest["files"][name]["path"])


def manifest_of(data: Any, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The manifest of a prepare stage's output (``data``: its XCom), the files ``names``
    (default: all) checked against their checksums."""
    if not isinstance(data, dict) or "manifest" not in data:
        raise InputError(
            "data must be the output of a DataPrepOperator (its XCom: a dict with "
            f"'manifest'), got {type(data).__name__}"
        )
    return verify_manifest(Path(data["manifest"]), names)


def prepare_stage(cfg: PipelineConfig, shards: int = 0) -> dict[str, Any]:
    """The prepare task: the data prepared (or found prepared); its XCom, which the
    later stages read the manifest through."""
    m = prepare(cfg, shards)
    rows = {k: f["rows"] for k, f in m["files"].items()}
    return {
        "manifest": str(DataFiles(Path(m["dir"])).manifest),
        "version": m["version"],
        "dir": m["dir"],
        "rows": rows,
        "shards": list(range(shards)),
    }
