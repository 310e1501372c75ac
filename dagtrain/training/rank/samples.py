"""A split's samples, read a batch at a time: arrays in memory, or a DAG author's
``torch.utils.data.Dataset`` whose items are read only when a rank's share of a batch
needs them.

``data.source: "package.module:factory"`` names a function of no arguments that returns
a map-style Dataset of ``(features, label)`` pairs (or a pair of arrays, which is read
like a file). The data-prep stage reads every item once: it checks them (a pair, numeric
features of one shape, integer labels 0..C-1), splits their *indices* (seeded, as for
arrays), and computes the training split's statistics with the one function arrays use,
:class:`RunningStats`, over the same samples in the same order: a Dataset of the same
arrays as an .npz therefore trains to the same parameters, bit for bit. A split's file is
then a small .npz (``index``, ``mean``, ``std``, ``factory``, ``code_dir``,
``in_shape``, ``classes``) that :func:`open_split` turns back into samples.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dagtrain.config import is_factory
from dagtrain.errors import InputError

__all__ = [
    "ArraySamples",
    "DatasetSamples",
    "RunningStats",
    "call_factory",
    "check_picklable",
    "is_factory",
    "loader",
    "read_items",
]

# rows per chunk of the statistics' float64 sums: both paths cut the same chunks
STATS_CHUNK = 1024


class RunningStats:
    """Mean and std per feature of rows added in order, in float64 sums over fixed chunks
    of ``STATS_CHUNK`` rows: the same rows in the same order give the same bits however
    they arrive (all at once, or an item at a time)."""

    def __init__(self) -> None:
        self.n = 0
        self._sum: np.ndarray | None = None
        self._sq: np.ndarray | None = None
        self._held: list[np.ndarray] = []
        self._held_rows = 0

    def add(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.float32)
        self._held.append(rows.reshape(len(rows), -1))
        self._held_rows += len(rows)
        while self._held_rows >= STATS_CHUNK:
            block = np.concatenate(self._held)
            self._fold(block[:STATS_CHUNK])
            rest = block[STATS_CHUNK:]
            self._held, self._held_rows = ([rest] if len(rest) else []), len(rest)

    def _fold(self, chunk: np.ndarray) -> None:
        c = chunk.astype(np.float64)
        s, q = c.sum(axis=0), (c * c).sum(axis=0)
        self._sum = s if self._sum is None else self._sum + s
        self._sq = q if self._sq is None else self._sq + q
        self.n += len(chunk)

    def result(self, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) as float32 arrays of ``shape``; a constant feature's std is 1."""
        if self._held_rows:
            self._fold(np.concatenate(self._held))
            self._held, self._held_rows = [], 0
        if not self.n:
            return np.zeros(shape, np.float32), np.ones(shape, np.float32)
        mean = self._sum / self.n
        var = np.maximum(self._sq / self.n - mean * mean, 0.0)
        std = np.sqrt(var).astype(np.float32)
        std[std == 0] = 1.0
        return mean.astype(np.float32).reshape(shape), std.reshape(shape)


def call_factory(spec: str, code_dirs: Iterable[str | None] = ()) -> Any:
    """What ``data.source``'s factory returns; InputError naming the field when it
    cannot be imported or called. ``code_dirs``: folders to import it from when the
    installed packages and ``sys.path`` lack it (the config file's folder)."""
    mod, _, attr = spec.partition(":")
    for folder in code_dirs:
        if folder and os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
    try:
        fn: Any = importlib.import_module(mod)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        why = (
            f"module {mod!r} has no {attr!r}"
            if isinstance(e, AttributeError)
            else f"{type(e).__name__}: {e}"
        )
        raise InputError(
            f"data.source {spec!r}: cannot import the factory ({why}); put the module next "
            "to the config or DAG file (or in Airflow's plugins folder), or install it "
            "where the tasks run"
        ) from e
    if not callable(fn):
        raise InputError(f"data.source {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    try:
        return fn()
    except Exception as e:
        raise InputError(
            f"data.source {spec!r}: the factory raised {type(e).__name__}: {e} (at {_where(e, fn)})"
        ) from e


def _where(e: BaseException, fn: Any) -> str:
    """``file:line`` in the user's code where ``e`` came from: the innermost frame of
    its traceback outside dagtrain, the standard library and the installed packages
    (numpy's own lines say less than the user's call of it); the factory's definition
    when no frame is the user's (it was called with arguments it does not take)."""
    import inspect
    import sysconfig
    import traceback

    def folder(path: str) -> str:
        return os.path.join(os.path.abspath(path), "")

    try:
        source: str | None = inspect.getsourcefile(fn)
    except TypeError:
        source = None
    ours = folder(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))  # dagtrain/
    libs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    theirs = (ours, *(folder(p) for p in sorted(libs)))
    user = folder(os.path.dirname(source)) if source else None  # installed or not
    frames = traceback.extract_tb(e.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<"):
            continue
        if (user and path.startswith(user)) or not path.startswith(theirs):
            return f"{frame.filename}:{frame.lineno}"
    try:
        return f"{source}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def as_dataset(spec: str, obj: Any) -> Any:
    """``obj`` if it is a map-style Dataset (``__len__`` and ``__getitem__``), else an
    InputError naming ``data.source`` and what a factory may return."""
    if isinstance(obj, torch.utils.data.IterableDataset):
        raise InputError(
            f"data.source {spec!r}: the factory returned an IterableDataset; a rank reads "
            "its share of each batch by index, so return a map-style Dataset (with "
            "__len__ and __getitem__) or a pair of arrays (features, labels)"
        )
    if not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")) or isinstance(
        obj, (str, bytes, dict)
    ):
        raise InputError(
            f"data.source {spec!r}: the factory returned {type(obj).__name__}, not a "
            "torch.utils.data.Dataset of (features, label) pairs or a pair of arrays"
        )
    if len(obj) == 0:
        raise InputError(f"data.source {spec!r}: the factory's Dataset is empty")
    return obj


def item_arrays(spec: str, i: int, item: Any) -> tuple[np.ndarray, int]:
    """Item ``i`` as (float32 features, integer label); InputError naming the item and
    what it should be otherwise."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        what = f"a {type(item).__name__}" + (
            f" of {len(item)}" if isinstance(item, (tuple, list)) else ""
        )
        raise InputError(f"data.source {spec!r}: item {i} is {what}, not a (features, label) pair")
    x, y = item
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise InputError(
            f"data.source {spec!r}: item {i}'s features are {x.dtype}, not numbers "
            "(a tensor or array of numbers)"
        )
    if isinstance(y, torch.Tensor | np.ndarray):
        if y.size != 1 if isinstance(y, np.ndarray) else y.numel() != 1:
            raise InputError(
                f"data.source {spec!r}: item {i}'s label has shape {tuple(y.shape)}; a "
                "label is one integer class"
            )
        y = y.item()
    if isinstance(y, bool) or not isinstance(y, numbers.Real) or int(y) != y or y < 0:
        raise InputError(
            f"data.source {spec!r}: item {i}'s label is {y!r}; labels must be integers 0..C-1"
        )
    return x.astype(np.float32, copy=False), int(y)


def _items(batch: list[Any]) -> list[Any]:  # the loader's collate: the items as they are
    return batch


def check_picklable(spec: str, ds: Any) -> None:
    """InputError naming ``data.source`` and ``data.workers`` when the Dataset does not
    pickle: DataLoader workers start in a fresh process (:func:`_workers`) and receive
    it pickled."""
    import pickle

    try:
        pickle.dumps(ds)
    except Exception as e:
        raise InputError(
            f"data.source {spec!r}: with data.workers, the Dataset is sent to its worker "
            f"processes, and it does not pickle ({type(e).__name__}: {e}); keep no lambda, "
            "open file or connection in it (open them in __getitem__), or set data.workers "
            "to 0"
        ) from e


def _workers() -> Any:
    """How DataLoader worker processes start: from a fork server, never by forking the
    process that reads. A rank starts its workers from a task-graph thread while its
    other threads (the step's, gloo's, the transfers') run; ``fork`` copies any lock
    one of them holds at that instant, and a worker that then needs it waits forever
    (torch's thread-pool set-up takes one in ``__cxa_atexit``: pytorch#130610). A CI
    run saw it: rank 1's worker never delivered a batch, and rank 0's allreduce timed
    out 60 s later. The fork server is a fresh interpreter without threads; each worker
    imports the Dataset's module there, so the Dataset must pickle (``dagtrain
    validate`` and prep check that it does)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    # the server imports torch once; each worker forked from it has it (not its own
    # import: seconds per worker on a busy machine)
    ctx.set_forkserver_preload([__name__])
    return ctx


def _die_with(reader: int, worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: the worker ends when process ``reader``
    (the rank or task that reads through it) ends, however it ends. A worker started
    from the fork server is the server's child, and torch's own watchdog watches the
    parent (the server); the server in turn lives while any worker holds its pipe. A
    rank killed mid-epoch left both waiting forever: nothing may outlive its task."""
    import select
    import threading
    import time

    def watch() -> None:
        try:
            fd = os.pidfd_open(reader)
        except OSError:  # gone already, or no pidfd here: look every second
            while _alive(reader):
                time.sleep(1.0)
        else:
            select.select([fd], [], [])  # readable once the process has ended
        os._exit(0)

    threading.Thread(target=watch, name="dagtrain-reader-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that number: ours has ended
        return False
    return True


def read_items(
    spec: str, ds: Any, workers: int = 0, chunk: int = 256
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first index, features, labels) of every item in order, ``chunk`` at a time,
    checked (one shape, finite numbers, integer labels); ``workers`` DataLoader worker
    processes read them."""
    batches: Iterable[list[Any]]
    if workers:
        check_picklable(spec, ds)
        batches = torch.utils.data.DataLoader(
            ds,
            batch_size=chunk,
            num_workers=workers,
            collate_fn=_items,
            multiprocessing_context=_workers(),
            worker_init_fn=functools.partial(_die_with, os.getpid()),
        )
    else:
        n = len(ds)
        batches = ([ds[i] for i in range(s, min(s + chunk, n))] for s in range(0, n, chunk))
    shape: tuple[int, ...] | None = None
    start = 0
    for items in batches:
        xs, ys = [], []
        for k, item in enumerate(items):
            x, y = item_arrays(spec, start + k, item)
            if shape is None:
                shape = x.shape
            elif x.shape != shape:
                raise InputError(
                    f"data.source {spec!r}: item {start + k}'s features have shape "
                    f"{x.shape}, item 0's {shape}; every sample must have one shape"
                )
            xs.append(x)
            ys.append(y)
        xa = np.stack(xs)
        if not np.all(np.isfinite(xa)):
            bad = start + int(np.argwhere(~np.isfinite(xa.reshape(len(xa), -1)))[0][0])
            raise InputError(f"data.source {spec!r}: item {bad}'s features hold NaN or infinity")
        yield start, xa, np.asarray(ys, np.int64)
        start += len(items)


class ArraySamples:
    """Samples held in memory: a batch is an index into the arrays."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


class DatasetSamples:
    """Samples of a DAG author's Dataset: position ``i`` of this split is the Dataset's
    item ``index[i]``; a batch reads its items and standardises them with the training
    split's ``(mean, std)`` (0 and 1 when ``data.normalize`` is off), in float32, as
    the data-prep stage does to arrays."""

    def __init__(
        self, dataset: Any, index: np.ndarray, mean: np.ndarray, std: np.ndarray, spec: str
    ) -> None:
        self.dataset, self.spec = dataset, spec
        self.index = index.astype(np.int64)
        self.mean, self.std = torch.from_numpy(mean), torch.from_numpy(std)

    def __len__(self) -> int:
        return len(self.index)

    def subset(self, positions: np.ndarray) -> DatasetSamples:
        """The samples at ``positions`` of this split, in that order."""
        out = DatasetSamples.__new__(DatasetSamples)
        out.dataset, out.spec, out.mean, out.std = self.dataset, self.spec, self.mean, self.std
        out.index = self.index[positions]
        return out

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.index[idx.numpy()]
        pairs = [item_arrays(self.spec, int(i), self.dataset[int(i)]) for i in rows]
        if not pairs:
            shape = tuple(self.mean.shape)
            return torch.empty(0, *shape), torch.empty(0, dtype=torch.int64)
        x = torch.from_numpy(np.stack([p[0] for p in pairs])).reshape(len(pairs), *self.mean.shape)
        y = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
        return (x - self.mean) / self.std, y


Samples = ArraySamples | DatasetSamples


class _Batches(torch.utils.data.Dataset):
    """A DataLoader's dataset whose key is a whole batch's indices."""

    def __init__(self, samples: DatasetSamples) -> None:
        self.samples = samples

    def __len__(self) -> int:  # pragma: no cover - keys come from the sampler
        return len(self.samples)

    def __getitem__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.samples.batch(idx)


def loader(
    samples: Samples, plan: Iterable[torch.Tensor], workers: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of ``plan`` (index tensors, in order): read here, or, for a Dataset
    with ``workers``, by that many DataLoader worker processes, a few batches ahead."""
    if workers and isinstance(samples, DatasetSamples):
        return iter(
            torch.utils.data.DataLoader(
                _Batches(samples),
                sampler=_Plan(plan),
                batch_size=None,
                num_workers=workers,
                prefetch_factor=2,
                multiprocessing_context=_workers(),
                worker_init_fn=functools.partial(_die_with, os.getpid()),
            )
        )
    return (samples.batch(idx) for idx in plan)


class _Plan:
    """An iterable of batch keys for a DataLoader's sampler (iterated once)."""

    def __init__(self, plan: Iterable[torch.Tensor]) -> None:
        self.plan = plan

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.plan)


def evaluate_batches(
    samples: Samples, size: int = 4096
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole split in order, ``size`` samples at a time."""
    n = len(samples)
    for s in range(0, n, size):
        yield samples.batch(torch.arange(s, min(s + size, n)))


def whole(samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sample of the split, as one (features, labels) pair."""
    if isinstance(samples, ArraySamples):
        return samples.x, samples.y
    parts = list(evaluate_batches(samples))
    if not parts:
        return torch.empty(0, *samples.mean.shape), torch.empty(0, dtype=torch.int64)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
