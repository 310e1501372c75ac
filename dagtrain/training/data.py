"""Data: the digits set scikit-learn ships (a real default that needs no download) and
user arrays; deterministic, seeded sharding of each global batch over the ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dagtrain.errors import InputError

__all__ = ["Dataset", "load_dataset", "read_arrays", "shard_batches", "standardization"]


@dataclass
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    in_shape: tuple[int, ...]
    classes: int


def read_arrays(spec: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], int]:
    """(features, labels, sample shape, number of classes)."""
    if spec == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data.astype(np.float32), d.target.astype(np.int64), (1, 8, 8), 10
    shape: tuple[int, ...] | None = None
    classes = 0
    path = Path(spec)
    if not path.exists():
        raise InputError(f"data {spec!r}: no such file (or use 'digits')")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            xk = "x" if "x" in keys else "X" if "X" in keys else None
            if xk is None or "y" not in keys:
                raise InputError(
                    f"data {spec!r}: an .npz needs arrays 'x' (or 'X') and 'y', "
                    f"found {sorted(keys)}"
                )
            x, y = z[xk], z["y"]
            # written by the data-prep stage: a shard may lack a class, its model must not
            if "in_shape" in keys:
                shape = tuple(int(v) for v in z["in_shape"])
            if "classes" in keys:
                classes = int(z["classes"])
    elif suffix == ".npy":
        a = np.load(path, allow_pickle=False)
        if a.ndim != 2 or a.shape[1] < 2:
            raise InputError(f"data {spec!r}: an .npy must be 2-D, the label in its last column")
        x, y = a[:, :-1], a[:, -1]
    elif suffix == ".csv":
        x, y = _read_csv(path, spec)
    elif suffix == ".parquet":
        try:
            import pandas as pd
        except ImportError as e:
            raise InputError(f"data {spec!r}: reading parquet needs pandas and pyarrow") from e
        df = pd.read_parquet(path)
        label = "label" if "label" in df.columns else df.columns[-1]
        y = df[label].to_numpy()
        x = df.drop(columns=[label]).to_numpy()
    else:
        raise InputError(f"data {spec!r}: use .npz, .npy, .csv or .parquet")
    if len(x) != len(y) or len(x) == 0:
        raise InputError(f"data {spec!r}: {len(x)} rows of features but {len(y)} labels")
    if not np.all(np.isfinite(x)):
        raise InputError(f"data {spec!r}: features contain NaN or infinity")
    yi = y.astype(np.int64)
    if not np.array_equal(yi, y) or yi.min() < 0:
        raise InputError(f"data {spec!r}: labels must be integers 0..C-1")
    if not classes:  # a source (not a prepared split, which may lack a class): 0..C-1
        _check_classes(spec, yi)
    if shape is not None and math.prod(shape) != math.prod(x.shape[1:]):
        raise InputError(f"data {spec!r}: in_shape {shape} does not fit samples of {x.shape[1:]}")
    classes = max(classes, int(yi.max()) + 1)
    return x.astype(np.float32), yi, shape or tuple(x.shape[1:]), classes


def _check_classes(spec: str, y: np.ndarray) -> None:
    """Labels are the classes 0..C-1, each of them present: labels 1..3 would otherwise
    train a model of 4 classes, one of which never appears."""
    present = np.unique(y)
    if len(present) == int(present[-1]) + 1:
        return
    missing = sorted(set(range(int(present[-1]) + 1)) - {int(v) for v in present})
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    labels = ", ".join(map(str, present[:8].tolist())) + (", ..." if len(present) > 8 else "")
    raise InputError(
        f"data {spec!r}: labels must be the classes 0..C-1, each present; the labels are "
        f"{labels} (missing: {shown}); relabel them 0..{len(present) - 1}"
    )


def standardization(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) per feature of the training samples, a constant feature's std 1: the
    one normalisation, ``(x - mean) / std``, of the trainer and the data-prep stage."""
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std == 0] = 1.0
    return mean, std


def _read_csv(path: Path, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """Numeric columns, the label last; a header row (no number in it) is skipped."""
    import warnings

    if not path.read_text(errors="replace").strip():
        raise InputError(f"data {spec!r}: the CSV file is empty")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns about what we report below
        try:
            a = np.genfromtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
        except ValueError as e:  # rows of different lengths
            raise InputError(f"data {spec!r}: not a rectangular CSV ({e})") from None
    if np.isnan(a[0]).all():  # a header row
        a = a[1:]
    if len(a) == 0:
        raise InputError(f"data {spec!r}: a header row and no data rows")
    if a.shape[1] < 2:
        raise InputError(
            f"data {spec!r}: one column; a CSV needs feature columns and the label last"
        )
    bad = np.isnan(a)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        cols = ", ".join(str(c + 1) for c in np.flatnonzero(bad.any(axis=0))[:5])
        raise InputError(
            f"data {spec!r}: column(s) {cols} hold text or empty cells (first at data row "
            f"{row + 1}, column {col + 1}); every column must be numeric, the label last"
        )
    return a[:, :-1], a[:, -1]


def load_dataset(spec: str, test_fraction: float, seed: int, normalize: bool = True) -> Dataset:
    """Load, split (seeded), and standardise with statistics of the training part only."""
    x, y, shape, classes = read_arrays(spec)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    xtr, xte = x[train], x[test]
    if normalize:
        mean, std = standardization(xtr)
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
    return Dataset(
        torch.from_numpy(np.ascontiguousarray(xtr)),
        torch.from_numpy(y[train]),
        torch.from_numpy(np.ascontiguousarray(xte)),
        torch.from_numpy(y[test]),
        shape,
        classes,
    )


def shard_batches(
    n: int, batch: int, rank: int, world: int, seed: int, epoch: int
) -> list[tuple[torch.Tensor, int]]:
    """This rank's sample indices for every step of an epoch, with each step's global count.

    One seeded permutation per epoch (the same on every rank); each global batch of
    ``batch`` samples (the last may be smaller) is cut into ``world`` contiguous parts,
    rank r taking part r. Every sample is seen exactly once per epoch across the ranks.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    steps = []
    for start in range(0, n, batch):
        chunk = perm[start : start + batch]
        parts = torch.tensor_split(chunk, world)
        steps.append((parts[rank], len(chunk)))
    return steps
