"""A split's samples, read a batch at a time: arrays in memory, or a DAG author's
``torch.utils.data.Dataset`` whose items are read only when a rank's share of a batch
needs them.

``data.source: "package.module:factory"`` names a function of no arguments that returns
a map-style Dataset of ``(input, target)`` pairs (or a pair of arrays, which is read
like a file). An input is a tensor (or array) of any shape and dtype, or a tuple, list
or dict of them; a target a tensor, array or number of any shape, checked against the
objective (:func:`item_arrays`): an integer class, real values, token ids, or, for the
author's own objective, numbers as they come. Floating arrays become float32, integer
ones int64 (token ids stay ids); a batch stacks its items' arrays, a dict's per key and
a tuple's per position, and is cut along the batch dimension of every tensor
(:mod:`.batches`).

The data-prep stage reads every item once (:func:`scan_items`): it checks them (a pair,
every item of item 0's form, finite numbers, targets the objective takes), splits their
*indices* (seeded, as for arrays), and computes the training split's statistics with
the one function arrays use, :class:`RunningStats`, over the same samples in the same
order: a Dataset of the same arrays as an .npz therefore trains to the same parameters,
bit for bit. Only an input that is one floating tensor is standardised. A split's file
is then a small .npz (``index``, ``mean``, ``std``, ``factory``, ``code_dir``,
``in_shape``, ``classes``) that :func:`.data.load_dataset` turns back into samples.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dagtrain.config import is_factory
from dagtrain.errors import InputError

from .items import (
    ItemForm,
    as_tensors,
    check_classes,
    check_finite,
    concat,
    empty_like,
    item_arrays,
    leaves,
    named,
    stack,
    target_kind,
)

if TYPE_CHECKING:
    from .data import DataForm

__all__ = [
    "ArraySamples",
    "DatasetSamples",
    "RunningStats",
    "Scan",
    "call_factory",
    "check_classes",
    "check_picklable",
    "first_batch",
    "is_factory",
    "item_arrays",
    "leaves",
    "loader",
    "named",
    "read_items",
    "scan_items",
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
    spec: str, ds: Any, workers: int = 0, chunk: int = 256, targets: str = "any"
) -> Iterator[tuple[int, Any, np.ndarray]]:
    """(first index, inputs, targets) of every item in order, ``chunk`` at a time,
    checked (:func:`item_arrays` against ``targets``; every item of item 0's form;
    finite floats) and stacked (a dict's or tuple's input per key or position);
    ``workers`` DataLoader worker processes read them."""
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
    like: ItemForm | None = None
    start = 0
    for items in batches:
        xs, ys = [], []
        for k, item in enumerate(items):
            x, y = item_arrays(spec, start + k, item, targets)
            if like is None:
                like = ItemForm(spec, x, y)
            else:
                like.check(start + k, x, y)
            xs.append(x)
            ys.append(y)
        xa, ya = stack(xs), stack(ys)
        check_finite(spec, start, [*leaves(xa), ("target", ya)])
        yield start, xa, ya
        start += len(items)


@dataclass(frozen=True)
class Scan:
    """What one pass over a Dataset's items learns. ``in_shape`` and ``in_dtype``: the
    input's (a tuple's or dict's: its first array's); ``classes``: the classes, the
    vocabulary (token ids) or a target's size (real values); ``mean``/``std``: the
    training items' statistics (identity where not standardised); ``digest``: a hash
    of every item's arrays."""

    in_shape: tuple[int, ...]
    classes: int
    mean: np.ndarray
    std: np.ndarray
    in_dtype: str
    target_shape: tuple[int, ...]
    target_dtype: str
    digest: str


def scan_items(
    spec: str, ds: Any, form: DataForm, train: np.ndarray, normalize: bool, workers: int = 0
) -> Scan:
    """Every item of ``ds`` read once, in order, and checked against ``form``.

    Only an input that is one floating array is standardised (the statistics of the
    items at positions ``train``, with :class:`RunningStats`: the bits arrays of the
    same samples get); integer inputs (token ids) and a tuple's or dict's are left as
    they are. Targets: ``classes`` must be 0..C-1, each present; ``tokens`` ids from 0
    up to ``data.vocab_size`` (the vocabulary: it, else the largest id of the targets
    and integer inputs + 1); ``any`` are counted as classes, ids or values as arrays'
    are, never refused."""
    in_train = np.zeros(len(ds), bool)
    in_train[train] = True
    h, stats = hashlib.sha256(), RunningStats()
    labels: list[np.ndarray] = []
    top = 0  # the largest integer target or input id seen
    first: tuple[Any, np.ndarray] | None = None
    for start, xs, ys in read_items(spec, ds, workers, targets=form.targets):
        named = leaves(xs)
        for _, a in named:
            h.update(a.tobytes())
        h.update(ys.tobytes())
        first = first or (xs, ys)
        if normalize and isinstance(xs, np.ndarray) and xs.dtype.kind == "f":
            stats.add(xs[in_train[start : start + len(xs)]])
        if ys.dtype.kind == "f":
            continue
        if ys.ndim == 1 and form.targets in ("classes", "any"):
            labels.append(ys)
        ids = [ys, *(a for _, a in named if a.dtype.kind in "iu")]
        top = max(top, *(int(a.max(initial=0)) for a in ids))
        if form.targets == "tokens" and ys.min(initial=0) < 0:
            bad = start + int(np.argwhere(ys.reshape(len(ys), -1) < 0)[0][0])
            raise InputError(f"data.source {spec!r}: item {bad}'s target holds negative token ids")
    assert first is not None  # as_dataset refuses an empty Dataset
    xs, ys = first
    shape = tuple(leaves(xs)[0][1].shape[1:])
    if isinstance(xs, np.ndarray) and xs.dtype.kind == "f" and normalize:
        mean, std = stats.result(shape)
    else:
        mean, std = np.zeros(shape, np.float32), np.ones(shape, np.float32)
    kind = form.targets
    if kind == "any":
        kind = target_kind(ys.dtype.kind, ys.ndim - 1)
    if kind == "values":
        classes = math.prod(ys.shape[1:])
    elif kind == "classes":
        y = np.concatenate(labels)
        if form.targets == "classes":
            check_classes(spec, y)
        classes = int(y.max(initial=0)) + 1
    else:
        classes = form.vocab_size or top + 1
        if form.targets == "tokens" and top >= classes:
            raise InputError(
                f"data.source {spec!r}: token id {top} is at or above data.vocab_size "
                f"({classes}); raise data.vocab_size above the largest id, or fix the ids"
            )
    h.update(repr(shape).encode())
    if not isinstance(xs, np.ndarray):  # arrays of the same bytes, another structure
        h.update(repr([(name, a.dtype.str) for name, a in leaves(xs)]).encode())
    return Scan(
        shape,
        classes,
        mean,
        std,
        str(leaves(xs)[0][1].dtype),
        tuple(ys.shape[1:]),
        str(ys.dtype),
        "dataset-" + h.hexdigest(),
    )


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
    item ``index[i]``; a batch reads its items, checks them against ``targets`` (a
    :class:`.data.DataForm`'s), stacks them (a dict's or tuple's input per key or
    position) and standardises an input that is one floating tensor with the training
    split's ``(mean, std)`` (0 and 1 when ``data.normalize`` is off), in float32, as
    the data-prep stage does to arrays; other inputs are left as they are."""

    def __init__(
        self,
        dataset: Any,
        index: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        spec: str,
        targets: str = "any",
    ) -> None:
        self.dataset, self.spec, self.targets = dataset, spec, targets
        self.index = index.astype(np.int64)
        self.mean, self.std = torch.from_numpy(mean), torch.from_numpy(std)

    def __len__(self) -> int:
        return len(self.index)

    def subset(self, positions: np.ndarray) -> DatasetSamples:
        """The samples at ``positions`` of this split, in that order."""
        out = DatasetSamples.__new__(DatasetSamples)
        out.dataset, out.spec, out.targets = self.dataset, self.spec, self.targets
        out.mean, out.std = self.mean, self.std
        out.index = self.index[positions]
        return out

    def batch(self, idx: torch.Tensor) -> tuple[Any, torch.Tensor]:
        rows = self.index[idx.numpy()]
        pairs = [item_arrays(self.spec, int(i), self.dataset[int(i)], self.targets) for i in rows]
        if pairs:
            x, y = (
                as_tensors(stack([p[0] for p in pairs])),
                as_tensors(stack([p[1] for p in pairs])),
            )
        else:  # a rank's empty share: item 0's form, no samples
            x0, y0 = item_arrays(self.spec, 0, self.dataset[0], self.targets)
            x, y = as_tensors(empty_like(x0)), as_tensors(empty_like(y0))
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = (x - self.mean) / self.std
        return x, y


def first_batch(spec: str, ds: Any, targets: str = "any", n: int = 2) -> tuple[Any, torch.Tensor]:
    """The Dataset's first ``n`` items checked against ``targets`` and stacked as a
    batch of tensors, not standardised: what a check before training passes through
    the model (the input's shape: its first tensor's, :func:`leaves`)."""
    rows = np.arange(min(n, len(ds)))
    return DatasetSamples(
        ds, rows, np.zeros((), np.float32), np.ones((), np.float32), spec, targets
    ).batch(torch.arange(len(rows)))


Samples = ArraySamples | DatasetSamples


class _Batches(torch.utils.data.Dataset):
    """A DataLoader's dataset whose key is a whole batch's indices."""

    def __init__(self, samples: DatasetSamples) -> None:
        self.samples = samples

    def __len__(self) -> int:  # pragma: no cover - keys come from the sampler
        return len(self.samples)

    def __getitem__(self, idx: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return self.samples.batch(idx)


def loader(
    samples: Samples, plan: Iterable[torch.Tensor], workers: int
) -> Iterator[tuple[Any, torch.Tensor]]:
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


def evaluate_batches(samples: Samples, size: int = 4096) -> Iterator[tuple[Any, torch.Tensor]]:
    """The whole split in order, ``size`` samples at a time."""
    n = len(samples)
    for s in range(0, n, size):
        yield samples.batch(torch.arange(s, min(s + size, n)))


def whole(samples: Samples) -> tuple[Any, torch.Tensor]:
    """Every sample of the split, as one (inputs, targets) pair."""
    if isinstance(samples, ArraySamples):
        return samples.x, samples.y
    parts = list(evaluate_batches(samples)) or [samples.batch(torch.arange(0))]
    return concat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
