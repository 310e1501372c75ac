"""Checkpoints: atomic, checksummed, the last K kept, the newest valid one found.

Layout of a checkpoint directory::

    ckpt-00000120.pt          torch.save of the state (tensors, dicts, numbers)
    ckpt-00000120.pt.json     {"step": 120, "sha256": "...", "bytes": 123456}

Both files are written to a temporary name, fsynced, then renamed; the sidecar comes
last, so a checkpoint without a sidecar (a crash in between) or whose bytes do not
match it (truncated, corrupted) is skipped with a warning, and the previous one used.
Loading uses ``torch.load(weights_only=True)``: a checkpoint holds no code.

A pipeline's checkpoint is sharded by stage, with no gather: each stage's first
replica writes its own parameters and optimizer state, in parallel, through
``torch.distributed.checkpoint`` (DCP, :mod:`.tensor_folder`)::

    ckpt-00000120.pt          stage 0's part, the run's figures, and ``shards``: the
                              other stages' files with the keys and parameters each holds
    ckpt-00000120.stage0.dcp/ stage 0's tensors: a DCP checkpoint
    ckpt-00000120.stage1.pt   stage 1's part (and its sidecar), ...
    ckpt-00000120.stage1.dcp/ stage 1's tensors, ...

A part's file holds its state with each tensor's place marked; the tensors are in its
DCP folder, written under a temporary name, then renamed; the part's sidecar, written
last, holds every one of the folder's files' checksums. A checkpoint is valid when
every file it lists is (each against its own sidecar, each folder's files against
theirs). :func:`load` consolidates the shards into one state (the model any consumer
sees: evaluation, the registry, a data-parallel resume), or, given ``keys``, reads
only the shards holding those (a pipeline rank resuming its stage, on any split): DCP
reads each tensor into a tensor of the size and type its metadata gives.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dagtrain.atomic import atomic_write, fsync_dir, umask
from dagtrain.errors import InputError
from dagtrain.records.names import CHECKPOINT, SHARD, SIDECAR, TENSORS

__all__ = ["combine_digests", "latest", "load", "save", "state_digest", "tensor_digests"]

log = logging.getLogger(__name__)


def save(
    state: dict[str, Any],
    directory: str | os.PathLike,
    step: int,
    keep: int = 3,
    protect: int | None = None,
    stage: int = 0,
) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (``stage`` > 0: that stage's shard
    of a pipeline's); keep the newest ``keep``, and the checkpoint of step ``protect``
    (early stopping's best epoch) whatever its age. One writer per stage and directory.

    A sharded checkpoint (a shard, or stage 0's file listing ``shards``) keeps ``keep``
    + 2 files of each stage: the stages' writers run in the background, each waiting
    only for its own previous write, so one stage may have finished checkpoint N (and
    rotated) while another is still writing N - 1; the newest checkpoint whose every
    shard is written, N - 2, must still be there (with ``keep`` 1 alone, a crash then
    could leave none whole)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, not {keep}")
    if stage > 0 or state.get("shards"):
        keep += 2
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # the stages of this run (stage 0's state lists the others' shards); rank 0 also
    # clears what the stages it does not have left (they have no writer now)
    stages = 1 + len(state.get("shards") or []) if stage == 0 else None
    for stale in d.glob(".ckpt-*"):  # temp files of this stage's writer killed mid-write
        of = _stage_of(stale.name.lstrip(".").rsplit(".", 1)[0].removesuffix(".json"))
        if of == stage or (stages is not None and of is not None and of >= stages):
            _delete(stale)
    path = d / _name(step, stage)
    if stage > 0 or state.get("shards"):
        part, files = _save_tensors(state, d / TENSORS(step=step, stage=stage))
        write(path, part, step=step, tensors=files)
    else:
        write(path, state, step=step)
    fsync_dir(d)
    for old in _steps(d, stage)[:-keep]:
        if old == protect:
            continue
        _remove(d, old, stage)
    for p in d.iterdir():  # tensors of this stage whose part's file was never written
        m = TENSORS.match(p.name)
        if m and m["stage"] == stage and m["step"] != step and not (d / _name(**m)).exists():
            _delete(p)
    if stages is not None:
        # shards of the stages this run does not have (it resumed on fewer stages, or
        # without a pipeline) have no writer to rotate them: rank 0 removes each once
        # its checkpoint's own file is rotated out (that checkpoint was gone with it)
        own = set(_steps(d))
        for p in d.iterdir():
            m = SHARD.match(p.name) or TENSORS.match(p.name)
            if m and m["stage"] >= stages and m["step"] not in own:
                _remove(d, m["step"], m["stage"])
    return path


def write(path: Path, obj: Any, **meta: Any) -> dict[str, Any]:
    """``torch.save(obj)`` to ``path`` and its sidecar (``meta`` with the file's
    ``sha256`` and ``bytes``), each atomically; returns the sidecar's fields. Straight
    to the file, hashed on the way: the bytes are never held in memory (a pipeline
    stage's checkpoint is as large as its parameters and optimizer state, a model
    file as its parameters)."""
    sink = _Hashed()
    atomic_write(path, lambda f: torch.save(obj, sink.over(f)))
    meta = {**meta, "sha256": sink.sha.hexdigest(), "bytes": sink.bytes}
    atomic_write(_sidecar(path), json.dumps(meta).encode())
    return meta


def _remove(d: Path, step: int, stage: int) -> None:
    """A checkpoint's file of ``stage``, its sidecar (first: the part is invalid from
    then on) and its tensors' folder."""
    path = d / _name(step, stage)
    _sidecar(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    _delete(d / TENSORS(step=step, stage=stage))


def _delete(path: Path) -> None:
    """A file, or a folder and what it holds; nothing if neither is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# a tensor's place in a stage's part: its bytes are in the part's DCP folder
_IN_DCP = "<dcp>"


def _save_tensors(state: dict[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the tensors of a stage's ``state`` (its model's and its optimizer
    state's) into ``folder`` through DCP (:mod:`.tensor_folder`); return the state
    with each one's place marked, and each of the folder's files' sha256 and size."""
    from .tensor_folder import save_tensors

    tensors: dict[str, torch.Tensor] = {}

    def take(key: str, v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        tensors[key] = v.detach()
        return _IN_DCP

    part = dict(state)
    part["model"] = {k: take(f"model/{k}", v) for k, v in state["model"].items()}
    part["optim"] = [
        {
            **opt,
            "state": {
                i: {k: take(f"optim/{n}/{i}/{k}", v) for k, v in st.items()}
                for i, st in opt["state"].items()
            },
        }
        for n, opt in enumerate(state["optim"])
    ]
    _delete(folder)
    if not tensors:
        return part, {}
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # (mkdtemp's is 0700: readable as the files are)
        save_tensors(tensors, tmp)
        digests = {p.name: _digest(p) for p in sorted(tmp.iterdir())}
        fsync_dir(tmp)
        os.replace(tmp, folder)
    except BaseException:
        _delete(tmp)
        raise
    return part, digests


def _digest(path: Path) -> dict[str, Any]:
    """A file's sha256 and size, read in chunks."""
    h, n = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
            n += len(chunk)
    return {"sha256": h.hexdigest(), "bytes": n}


def _folder(path: Path) -> Path:
    """The DCP folder of the part of a pipeline's checkpoint in ``path``."""
    m = SHARD.match(path.name) or {"stage": 0, **(CHECKPOINT.match(path.name) or {"step": -1})}
    return path.with_name(TENSORS(step=m["step"], stage=m["stage"]))


def _check_tensors(path: Path, files: dict[str, Any]) -> None:
    """Check the DCP folder of ``path``'s part against the checksums its sidecar
    lists (InputError if a file is missing, extra or bad)."""
    if not files:
        return
    folder = _folder(path)
    try:
        there = sorted(p.name for p in folder.iterdir())
    except OSError as e:
        raise InputError(
            f"{path.name}: its tensors' folder {folder.name} cannot be read ({e})"
        ) from e
    if there != sorted(files):
        raise InputError(
            f"{folder.name} holds {there}, not the files {path.name}'s sidecar lists "
            f"{sorted(files)}: not this checkpoint's"
        )
    for name, want in files.items():
        try:
            got = _digest(folder / name)
        except OSError as e:
            raise InputError(f"{folder.name}/{name}: cannot be read ({e})") from e
        if got != {"sha256": want.get("sha256"), "bytes": want.get("bytes")}:
            raise InputError(f"{folder.name}/{name}: checksum mismatch (truncated or corrupted)")


def _load_tensors(path: Path, state: dict[str, Any], read: set[str] | None = None) -> None:
    """Read the tensors whose places ``state`` (``path``'s part, checked) marks from
    its DCP folder, in place of the marks; with ``read``, the model's others are put
    there as meta tensors of their sizes and types, unread."""
    places: dict[str, tuple[dict[Any, Any], Any]] = {}
    for k, v in (state.get("model") or {}).items():
        if isinstance(v, str) and v == _IN_DCP:
            places[f"model/{k}"] = (state["model"], k)
    for n, opt in enumerate(state.get("optim") or []):
        for i, st in opt["state"].items():
            for k, v in st.items():
                if isinstance(v, str) and v == _IN_DCP:
                    places[f"optim/{n}/{i}/{k}"] = (st, k)
    if not places:
        return
    from torch.distributed.checkpoint.api import CheckpointException

    from .tensor_folder import load_tensors, sizes

    folder = _folder(path)
    try:
        there = sizes(folder)
        missing = sorted(set(places) - set(there))
        if missing:
            raise InputError(
                f"{path.name}: its tensors' folder {folder.name} has no {missing[:3]}: "
                "not this checkpoint's"
            )
        skip = {k for k in places if read is not None and k.startswith("model/")}
        skip -= {f"model/{k}" for k in read or ()}
        wanted = [k for k in places if k not in skip]
        tensors = load_tensors(folder, wanted) if wanted else {}
        for k in skip:
            tensors[k] = torch.empty(there[k][0], dtype=there[k][1], device="meta")
    except (OSError, ValueError, RuntimeError, TypeError, AttributeError, CheckpointException) as e:
        # (DCP's CheckpointException is a BaseException: a latest() skipping a bad
        # checkpoint catches Exception)
        raise InputError(f"{folder.name}: cannot be read ({type(e).__name__}: {e})") from e
    for k, (holder, name) in places.items():
        holder[name] = tensors[k]


class _Hashed:
    """A file's writer that hashes and counts the bytes written through it."""

    def __init__(self) -> None:
        self.sha, self.bytes, self.f = hashlib.sha256(), 0, None

    def over(self, f: Any) -> _Hashed:
        self.f = f
        return self

    def write(self, b: Any) -> int:
        self.sha.update(b)
        self.bytes += memoryview(b).nbytes
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def _name(step: int, stage: int) -> str:
    return CHECKPOINT(step=step) if stage == 0 else SHARD(step=step, stage=stage)


def _stage_of(name: str) -> int | None:
    """The stage whose file (or tensors' folder) ``name`` is (0: a checkpoint's own
    file), None: neither."""
    if CHECKPOINT.match(name):
        return 0
    m = SHARD.match(name) or TENSORS.match(name)
    return None if m is None else m["stage"]


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a model state (each tensor's name and bytes): equal digests,
    bitwise-equal models. :func:`combine_digests` of :func:`tensor_digests`, so the
    stages of a pipeline, each digesting its own tensors, give the whole model's."""
    return combine_digests(tensor_digests(state))


def tensor_digests(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each tensor's sha256 (of its bytes), by name."""
    return {
        k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        for k, v in state.items()
    }


def combine_digests(digests: dict[str, str]) -> str:
    """One sha256 of the tensors' digests, in name order."""
    h = hashlib.sha256()
    for k in sorted(digests):
        h.update(k.encode())
        h.update(digests[k].encode())
    return h.hexdigest()


def _steps(d: Path, stage: int = 0) -> list[int]:
    if not d.is_dir():
        return []
    name = CHECKPOINT if stage == 0 else SHARD
    return sorted(
        m["step"] for p in d.iterdir() if (m := name.match(p.name)) and m.get("stage", 0) == stage
    )


def _sidecar(path: Path) -> Path:
    return path.with_name(SIDECAR(name=path.name))


def load(
    path: str | os.PathLike,
    keys: set[str] | None = None,
    mmap: bool = False,
    optim: bool = True,
    read: set[str] | None = None,
) -> dict[str, Any]:
    """Load one checkpoint after checking it against its sidecar; InputError if bad.

    A pipeline's (sharded) checkpoint is consolidated: every shard checked, and the
    model and optimizer state of those holding any of ``keys`` (all, when None) merged
    in; with ``keys``, ``model`` holds only those. ``mmap``: the files mapped, not read
    (a tensor's bytes come into memory where it is used), for a caller that copies
    what it uses and keeps none of the tensors (a tensor kept keeps its file mapped);
    a file of torch's older format, or one that cannot be mapped, is read, and so are
    a pipeline part's tensors (DCP reads them). ``optim=False``: the optimizer state's
    tensors are not read (each parameter's entry empty), for a caller that uses the
    model alone. ``read``: of a pipeline part's model tensors, only these are read, the
    others come back on the meta device (their shapes and types: a caller checking the
    whole model's shapes and taking its own stage's tensors). Either way the checksum
    check reads every byte once. A sharded checkpoint's state, consolidated, says how
    many stages wrote it (``stages``)."""
    path = Path(path)
    # a stage's resume wants none of the checkpoint's own file's tensors (stage 0's)
    # when its keys are all in shards: that file is then mapped, its tensors dropped
    # without being brought into memory (its run's figures and list of shards kept)
    read_if = None if keys is None or mmap else _wants(keys)
    state = _load_one(path, mmap, read_if, optim, read)
    shards = state.pop("shards", None)
    if shards:
        state["stages"] = 1 + len(shards)  # (sharded only: a state dict stays as it was)
        model, optims = dict(state["model"]), state["optim"]
        for sh in shards:
            f = path.with_name(sh["file"])
            if keys is not None and not keys.intersection(sh["keys"]):
                _verify(f)  # the checkpoint is whole only with it
                continue
            part = _load_one(f, mmap, optim=optim, read=read)
            if set(part["model"]) != set(sh["keys"]):  # a shard of another split's run
                raise InputError(
                    f"{f.name} does not hold the keys {path.name} lists for stage "
                    f"{sh['stage']} (a shard of another run's split): not this checkpoint's"
                )
            model.update(part["model"])
            for mine, theirs in zip(optims, part["optim"]):
                mine["state"].update(theirs["state"])
        state["model"] = model
    if keys is not None:
        state["model"] = {k: v for k, v in state["model"].items() if k in keys}
    return state


def _check(path: Path, f: Any) -> dict[str, Any]:
    """Check ``path`` (open as ``f``) against its sidecar, reading it in chunks
    (InputError if bad), and the tensors' folder the sidecar lists, if any; return
    the sidecar's fields. ``f`` is left at its start."""
    side = _sidecar(path)
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path.name}: no valid sidecar {side.name} ({e})") from e
    h, n = hashlib.sha256(), 0
    try:
        while chunk := f.read(1 << 24):
            h.update(chunk)
            n += len(chunk)
        f.seek(0)
    except OSError as e:
        raise InputError(f"{path.name}: cannot be read ({e})") from e
    if n != meta.get("bytes") or h.hexdigest() != meta.get("sha256"):
        raise InputError(f"{path.name}: checksum mismatch (truncated or corrupted)")
    _check_tensors(path, meta.get("tensors") or {})
    return meta


def _verify(path: Path) -> None:
    """Check ``path`` against its sidecar (InputError if missing or bad)."""
    try:
        with path.open("rb") as f:
            _check(path, f)
    except OSError as e:
        raise InputError(f"{path.name}: cannot be read ({e})") from e


def _wants(keys: set[str]) -> Callable[[dict[str, Any]], bool]:
    """Whether a checkpoint's own file (mapped) holds tensors a stage of ``keys`` uses:
    any of its model's, or it is not sharded (it holds the whole model)."""

    def wants(state: dict[str, Any]) -> bool:
        model = state.get("model")
        return not state.get("shards") or not isinstance(model, dict) or bool(keys & set(model))

    return wants


def _load_one(
    path: Path,
    mmap: bool = False,
    read_if: Callable[[dict[str, Any]], bool] | None = None,
    optim: bool = True,
    read: set[str] | None = None,
) -> dict[str, Any]:
    """The state in ``path``, checked against its sidecar first; mapped with ``mmap``
    where it can be. ``read_if``: the file is mapped, and read only if
    ``read_if(state)`` says its tensors are wanted; else its state comes back without
    them (no model, no optimizer state: nothing keeps the file mapped). ``optim``,
    ``read``: as :func:`load`'s."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise InputError(f"{path.name}: cannot be read ({e})") from e
    with f:
        side = _check(path, f)
        state = _read(path, f, mmap, read_if)
    if not optim:
        for st in state.get("optim") or []:
            if isinstance(st, dict):
                st["state"] = {}
    if side.get("tensors"):  # a pipeline's part: its tensors are in its DCP folder
        _load_tensors(path, state, read)
    return state


def _read(
    path: Path, f: Any, mmap: bool, read_if: Callable[[dict[str, Any]], bool] | None
) -> dict[str, Any]:
    """:func:`_load_one`'s reading of the file ``f`` (checked)."""
    mapped = None
    if (mmap or read_if is not None) and zipfile.is_zipfile(f):
        f.seek(0)
        # a file system that cannot map it (FUSE with direct_io): read instead
        with contextlib.suppress(InputError):
            mapped = _torch_load(path, f, mmap=True)
    if mapped is not None and read_if is not None and not read_if(mapped):
        mapped["model"] = {}
        for st in mapped.get("optim") or []:
            if isinstance(st, dict):
                st["state"] = {}
        return mapped
    if mapped is not None and mmap:
        return mapped
    del mapped
    f.seek(0)
    return _torch_load(path, f, mmap=False)


def _torch_load(path: Path, f: Any, mmap: bool) -> dict[str, Any]:
    try:
        # from the file checked, through the same descriptor (not its bytes read
        # whole: a stage's checkpoint is as large as its parameters and optimizer
        # state, and a rank holds it once, as tensors). mmap maps the descriptor's
        # file (/proc/self/fd), so even then the bytes read are those checked.
        # map_location: a GPU run's checkpoint loads anywhere (load_state_dict
        # then copies it to the model's device)
        src = f"/proc/self/fd/{f.fileno()}" if mmap else f
        state = torch.load(src, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as e:  # torch's message advises weights_only=False: never do that
        raise InputError(
            f"{path.name} is not a dagtrain checkpoint: it holds no tensors and plain "
            f"data that torch.load(weights_only=True) reads ({type(e).__name__})"
        ) from e
    if not isinstance(state, dict):
        raise InputError(f"{path.name} is not a dagtrain checkpoint: it holds no dict of states")
    return state


def latest(
    directory: str | os.PathLike, keys: set[str] | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads and matches its checksum (every shard of a
    pipeline's), as :func:`load` gives it, or None."""
    d = Path(directory)
    for step in reversed(_steps(d)):
        path = d / CHECKPOINT(step=step)
        try:
            return path, load(path, keys)
        except Exception as e:  # any unreadable checkpoint is skipped
            log.warning("skipping checkpoint %s: %s; trying the previous one", path, e)
    return None
