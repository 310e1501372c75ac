"""Data preparation: load, split (seeded), normalise with train statistics, shard, write.

The output is a versioned data directory: its version is a hash of the source's bytes
and of every setting that changes the arrays, so the same data and settings are
prepared once and every run that uses them shares them (and its lineage names them).

An object-storage source is copied here first (and its copy hashed); a factory's
Dataset is read once, item by item: checked, its bytes hashed, the training split's
statistics computed; its splits are then files of indices (see
:mod:`dagtrain.training.rank.samples`), its samples read by the ranks a batch at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dagtrain.config import BUILTIN_SOURCES, PipelineConfig
from dagtrain.errors import InputError
from dagtrain.records.layout import (
    ArtifactLayout,
    DataFiles,
    atomic_write,
    read_json,
    sha256_file,
    shard_split,
    write_json,
)

from .sources import check_source, fetch_url, source_kind

__all__ = ["data_file", "manifest_of", "prepare", "prepare_phase", "verify_manifest"]


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


_NOT_IN_VERSION = {"source", "workers", "connection"}


def _source_digest(cfg: PipelineConfig) -> str:
    src = check_source(cfg)
    if src in BUILTIN_SOURCES:
        from importlib.metadata import version

        return f"sklearn-{src}-{version('scikit-learn')}"  # not imported: ~2 s
    return sha256_file(Path(src))


def _targets_key(cfg: PipelineConfig) -> dict[str, str]:
    """What the objective makes of the targets, where it is not classes (a regression
    reads them as floats: another version of the same source)."""
    targets = cfg.objective.targets
    return {} if targets == "classes" else {"targets": targets}


def split_sizes(n: int, d: Any) -> tuple[int, int, int]:
    """How many of ``n`` samples the split of data section ``d`` puts in test, val and
    train."""
    n_test, n_val = round(n * d.test_fraction), round(n * d.val_fraction)
    return n_test, n_val, n - n_test - n_val


def _split(n: int, d: Any) -> dict[str, np.ndarray]:
    """The seeded split of ``n`` samples' positions: test, val, train."""
    order = np.random.default_rng(d.seed).permutation(n)
    n_test, n_val, _ = split_sizes(n, d)
    return {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }


class _Scanned:
    """A factory's source read once: arrays, or a Dataset's items checked against the
    objective's :class:`~dagtrain.training.rank.data.DataForm`, with their training
    statistics (:class:`~dagtrain.training.rank.samples.Scan`); ``digest`` hashes what
    it holds."""

    def __init__(self, cfg: PipelineConfig) -> None:
        from dagtrain.training.rank.data import checked_arrays, data_form, open_source

        spec, d = cfg.data.source, cfg.data
        src = open_source(spec, (cfg.base_dir,))
        form = data_form(cfg.train_config())
        self.dataset: Any = None
        if isinstance(src, tuple):
            h = hashlib.sha256()
            self.arrays = checked_arrays(spec, *src, None, 0, form)
            for a in self.arrays[:2]:
                h.update(np.ascontiguousarray(a).tobytes())
            h.update(repr(self.arrays[2]).encode())
            self.digest = "arrays-" + h.hexdigest()
            return
        from dagtrain.training.rank.samples import scan_items

        self.dataset, self.arrays = src, None
        self.parts = _split(len(src), d)
        self.scan = scan_items(spec, src, form, self.parts["train"], d.normalize, d.workers)
        self.digest = self.scan.digest


def prepare(cfg: PipelineConfig, shards: int = 0) -> dict[str, Any]:
    """Write train/val/test (and ``shards`` training shards); return the manifest."""
    from dagtrain.training.rank.data import data_form, read_arrays, standardization

    d = cfg.data
    layout = ArtifactLayout.of(cfg)
    kind = source_kind(cfg)
    local, scanned = cfg.data_source(), None
    if kind == "url":
        copy, digest = fetch_url(cfg, layout.sources)
        local = str(copy)
    elif kind == "factory":
        scanned = _Scanned(cfg)
        digest = scanned.digest
    else:
        digest = _source_digest(cfg)
    # what changes the prepared files: the source's bytes and the split's settings (not
    # how they are read: data.workers, data.connection)
    key = json.dumps(
        {"source": digest, **d.model_dump(exclude=_NOT_IN_VERSION, exclude_none=True)}
        | {"shards": shards}
        | _targets_key(cfg),
        sort_keys=True,
    )
    version = hashlib.sha256(key.encode()).hexdigest()[:16]
    files_of = layout.data(version)
    out, manifest_path = files_of.dir, files_of.manifest
    if manifest_path.exists():
        try:
            return verify_manifest(manifest_path)
        except ValueError:
            pass  # damaged: prepare again, over it
    files: dict[str, dict[str, Any]] = {}
    if scanned is not None and scanned.dataset is not None:
        scan = scanned.scan
        parts, shape, classes = scanned.parts, scan.in_shape, scan.classes
        mean, std = scan.mean, scan.std  # identity unless normalised (one floating input)
        meta = {
            "mean": mean,
            "std": std,
            "factory": np.array(d.source),
            "code_dir": np.array(cfg.base_dir or ""),
            "in_shape": np.array(shape, np.int64),
            "classes": np.array(classes, np.int64),
        }

        def write(name: str, idx: np.ndarray) -> Path:
            path = files_of.split(name)
            atomic_write(path, _npz_bytes(index=idx.astype(np.int64), **meta))
            return path
    else:
        form = data_form(cfg.train_config())
        x, y, shape, classes = scanned.arrays if scanned else read_arrays(local, form)
        parts = _split(len(x), d)
        floating = x.dtype.kind == "f"  # token ids and other integers stay as they are
        if d.normalize and floating:
            mean, std = standardization(x[np.sort(parts["train"])])
        else:
            mean, std = _identity(x.shape[1:])
        meta = {"in_shape": np.array(shape, np.int64), "classes": np.array(classes, np.int64)}

        def write(name: str, idx: np.ndarray) -> Path:
            xs = ((x[idx] - mean) / std).astype(np.float32) if floating else x[idx]
            path = files_of.split(name)
            atomic_write(path, _npz_bytes(x=xs, y=y[idx], **meta))
            return path

    # what the model factory learns of the data (DataInfo), kept with it
    if scanned is not None and scanned.dataset is not None:
        form = {"in_dtype": scan.in_dtype, "target_shape": list(scan.target_shape)}
        form["target_dtype"] = scan.target_dtype
    else:
        form = {"in_dtype": str(x.dtype), "target_shape": list(y.shape[1:])}
        form["target_dtype"] = str(y.dtype)
    if len(parts["train"]) < shards:
        raise InputError(f"data: {len(parts['train'])} training samples for {shards} shards")

    def put(name: str, idx: np.ndarray) -> None:
        path = write(name, idx)
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
        "source": cfg.shown()["data"]["source"],  # a URL without its credentials
        "source_kind": kind,
        "source_digest": digest,
        "settings": d.model_dump() | {"source": cfg.shown()["data"]["source"]},
        "in_shape": list(shape),
        "classes": classes,
        **form,
        "shards": shards,
        "files": files,
        "stats": {"path": files_of.stats.name, "sha256": sha256_file(files_of.stats)},
    }
    if kind == "url":
        manifest["copy"] = {"path": local, "sha256": digest}
    write_json(manifest_path, manifest)  # last: a manifest means the rest is complete
    return manifest


def _identity(shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(tuple(shape), np.float32), np.ones(tuple(shape), np.float32)


def verify_manifest(path: Path, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest, after checking the files ``names`` (default: all it lists) against
    their checksums: a task hashes only what it reads."""
    m = read_json(path)
    base = path.parent
    for name in m["files"] if names is None else names:
        f = m["files"].get(name)
        if f is None:
            raise InputError(f"data file {name} is not in {path} (its files: {sorted(m['files'])})")
        if not isinstance(f.get("path"), str) or Path(f["path"]).name != f["path"]:
            raise InputError(
                f"data file {name} of {path} is not a file of its folder: prepare the data again"
            )  # a manifest names files beside it, never a path elsewhere
        p = base / f["path"]
        if not p.exists() or sha256_file(p) != f["sha256"]:
            raise InputError(f"data file {name} ({p}) is missing or does not match its checksum")
    m["dir"] = str(base)
    return m


def data_file(manifest: dict[str, Any], name: str) -> str:
    return str(Path(manifest["dir"]) / manifest["files"][name]["path"])


def manifest_of(
    cfg: PipelineConfig, data: Any, names: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The manifest of the data version a prepare phase's output names (``data``: its
    XCom), the files ``names`` (default: all) checked against their checksums. Only the
    version is taken from the XCom, which a user who may trigger runs can rewrite: the
    folder is the pipeline's own (``cfg``'s artifact root, a file-only field), so no
    XCom can point a task at files elsewhere."""
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise InputError(
            "data must be the output of a DataPrepOperator (its XCom: a dict with the "
            f"data's 'version', a hex digest), got {type(data).__name__}"
            + (f" with version {str(version)[:40]!r}" if isinstance(data, dict) else "")
        )
    path = ArtifactLayout.of(cfg).data(version).manifest
    if not path.is_file():
        raise InputError(
            f"data version {version} is not prepared in this pipeline's artifacts: run its "
            "prepare_data task again"
        )
    return verify_manifest(path, names)


_VERSION = re.compile(r"[0-9a-f]{8,64}")


def prepare_phase(cfg: PipelineConfig, shards: int = 0) -> dict[str, Any]:
    """The prepare task: the data prepared (or found prepared); its XCom, which the
    later phases read the manifest through."""
    m = prepare(cfg, shards)
    rows = {k: f["rows"] for k, f in m["files"].items()}
    return {
        "manifest": str(DataFiles(Path(m["dir"])).manifest),
        "version": m["version"],
        "dir": m["dir"],
        "rows": rows,
        "shards": list(range(shards)),
    }
