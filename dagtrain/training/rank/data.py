"""Data: the digits set scikit-learn ships (a real default that needs no download),
user arrays, and a DAG author's Dataset (:mod:`.samples`); deterministic, seeded
sharding of each global batch over the ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dagtrain.config import TrainConfig
from dagtrain.errors import InputError

from .items import (
    FEATURES,
    check_classes,
    leaves,
)
from .items import named as _named
from .models import DataInfo
from .samples import (
    ArraySamples,
    DatasetSamples,
    RunningStats,
    Samples,
    as_dataset,
    call_factory,
    is_factory,
    scan_items,
    whole,
)

__all__ = [
    "DataForm",
    "Dataset",
    "data_form",
    "check_classes",
    "checked_arrays",
    "load_dataset",
    "open_source",
    "read_arrays",
    "shard_batches",
    "standardization",
]


@dataclass(frozen=True)
class DataForm:
    """What the run's objective makes of a source: its targets (``classes``, real
    ``values``, ``tokens``, or ``any`` for the author's own objective), and how a text
    or token source is cut (``data.sequence_length``, ``data.vocab_size``)."""

    targets: str = "classes"
    sequence_length: int | None = None
    vocab_size: int | None = None
    objective: str = "classification"


def data_form(cfg: TrainConfig) -> DataForm:
    """The run's :class:`DataForm`."""
    return DataForm(cfg.objective.targets, cfg.sequence_length, cfg.vocab_size, cfg.objective.name)


@dataclass
class Dataset:
    """The training samples and those evaluated on each epoch (the test or the
    validation split), arrays or a Dataset read a batch at a time."""

    train: Samples
    test: Samples
    in_shape: tuple[int, ...]
    classes: int
    form: DataForm = field(default_factory=DataForm)

    @property
    def info(self) -> DataInfo:
        """What the model factory learns of the data (:class:`.models.DataInfo`)."""
        x, y = self.train.batch(torch.arange(min(1, len(self.train))))
        first = leaves(x)[0][1]  # a tuple's or dict's input: its first tensor
        return DataInfo(
            tuple(self.in_shape),
            self.classes,
            str(first.dtype).removeprefix("torch."),
            tuple(y.shape[1:]),
            str(y.dtype).removeprefix("torch."),
            self.form.objective,
        )

    # whole splits as tensors (a Dataset's read in full): for code that wants arrays
    @property
    def x_train(self) -> torch.Tensor:
        return whole(self.train)[0]

    @property
    def y_train(self) -> torch.Tensor:
        return whole(self.train)[1]

    @property
    def x_test(self) -> torch.Tensor:
        return whole(self.test)[0]

    @property
    def y_test(self) -> torch.Tensor:
        return whole(self.test)[1]


_OPENED: dict[str, object] = {}


def open_source(spec: str, code_dirs: tuple[str | None, ...] = ()) -> object:
    """``data.source``'s factory called (once per process): a map-style Dataset, or a
    pair of arrays ``(features, labels)``; InputError naming the field for anything
    else."""
    if spec not in _OPENED:
        _OPENED[spec] = _opened(spec, call_factory(spec, code_dirs))
    return _OPENED[spec]


def _opened(spec: str, obj: object) -> object:
    if (
        isinstance(obj, (tuple, list))
        and len(obj) == 2
        and all(isinstance(a, (np.ndarray, torch.Tensor)) for a in obj)
    ):
        return tuple(a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in obj)
    return as_dataset(spec, obj)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits set's features and labels, read from the file scikit-learn ships as
    its ``load_digits`` reads it, without importing scikit-learn (about 2 s of a
    rank's, the data-prep task's and the preflight's start); ``load_digits`` itself
    where scikit-learn keeps the file elsewhere."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    origin = Path(spec.origin).parent if spec is not None and spec.origin else None
    file = origin / "datasets" / "data" / "digits.csv.gz" if origin else None
    if file is None or not file.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data, d.target
    with gzip.open(file, mode="rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int, copy=False)


def _diabetes() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's diabetes data: 442 patients' 10 features (unscaled) and a
    measure of the disease's progression a year later (a real number)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    origin = Path(spec.origin).parent / "datasets" / "data" if spec and spec.origin else None
    if origin is None or not (origin / "diabetes_target.csv.gz").is_file():
        from sklearn.datasets import load_diabetes

        d = load_diabetes(scaled=False)
        return d.data, d.target.astype(np.float64)
    x = np.loadtxt(origin / "diabetes_data_raw.csv.gz")
    return x, np.loadtxt(origin / "diabetes_target.csv.gz")


def read_arrays(
    spec: str, form: DataForm | None = None
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], int]:
    """(inputs, targets, an input's shape, the number of outputs: classes, the
    vocabulary, or a target's size), read as ``form`` says (default: classification)."""
    form = form or DataForm()
    if spec == "digits":
        x, y = _digits()
        return checked_arrays(spec, x, y, (1, 8, 8), 0, form)
    if spec == "diabetes":
        return checked_arrays(spec, *_diabetes(), None, 0, form)
    shape: tuple[int, ...] | None = None
    classes = 0
    if is_factory(spec):
        pair = open_source(spec)
        if not isinstance(pair, tuple):
            raise InputError(
                f"data.source {spec!r}: the factory returned a Dataset, read a batch at a "
                "time, not a pair of arrays"
            )
        return checked_arrays(spec, *pair, None, 0, form)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"data {spec!r}: no such file (or use 'digits' or 'diabetes')")
    suffix = path.suffix.lower()
    tokens = _tokens(spec, path, suffix)
    if tokens is not None:
        return _windows(spec, tokens, form, 256 if suffix == ".txt" else 0)
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
        raise InputError(
            f"data {spec!r}: use .npz, .npy, .csv or .parquet, or a text (.txt) or token "
            "ids (.bin, .npy) with data.sequence_length"
        )
    return checked_arrays(spec, x, y, shape, classes, form)


def _tokens(spec: str, path: Path, suffix: str) -> np.ndarray | None:
    """A text's bytes or a token file's ids, as one sequence; None for other files."""
    if suffix == ".txt":
        text = path.read_bytes()
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"data {spec!r}: not UTF-8 text ({e}); save it as UTF-8, or give its token "
                "ids as a .bin of uint16 or an .npy"
            ) from e
        return np.frombuffer(text, np.uint8).astype(np.int64)
    if suffix == ".bin":
        if path.stat().st_size % 2:
            raise InputError(
                f"data {spec!r}: {path.stat().st_size} bytes, not a whole number of uint16 "
                "token ids (a .bin holds them as nanoGPT writes them)"
            )
        return np.fromfile(path, np.uint16).astype(np.int64)
    if suffix == ".npy":
        a = np.load(path, allow_pickle=False, mmap_mode="r")
        if a.ndim == 1:
            if a.dtype.kind not in "iu":
                raise InputError(
                    f"data {spec!r}: a 1-D .npy is token ids and must be integers, not {a.dtype}"
                )
            return np.asarray(a, np.int64)
    return None


def _windows(
    spec: str, tokens: np.ndarray, form: DataForm, vocab: int
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], int]:
    """A token sequence cut into windows of ``data.sequence_length``, each window's
    target the same window shifted by one token."""
    n = form.sequence_length
    if n is None:
        raise InputError(
            f"data.sequence_length: data {spec!r} is a text or token ids; set "
            "data.sequence_length to cut it into windows (e.g. 64)"
        )
    if len(tokens) < n + 1:
        raise InputError(
            f"data.sequence_length {n} is longer than data {spec!r}, which holds "
            f"{len(tokens)} tokens: a window and its target need {n + 1}; lower it"
        )
    if form.targets not in ("tokens", "any"):
        raise InputError(
            f"objective.name: data {spec!r} is a text or token ids, whose targets are the "
            "next tokens; use objective.name: language_model"
        )
    if len(tokens) and tokens.min() < 0:
        raise InputError(f"data {spec!r}: negative token ids")
    count = (len(tokens) - 1) // n
    x = tokens[: count * n].reshape(count, n)
    y = tokens[1 : count * n + 1].reshape(count, n)
    return checked_arrays(spec, x, y, (n,), vocab, form)


def checked_arrays(
    spec: str,
    x: np.ndarray,
    y: np.ndarray,
    shape: tuple[int, ...] | None,
    classes: int,
    form: DataForm | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], int]:
    """Inputs and targets as the trainer takes them, or InputError naming ``spec`` and
    what is wrong: shapes, non-numbers, NaN, targets that do not fit the objective.

    Inputs are float32 for classification and regression, else float32 when floating
    and int64 when integer (token ids stay ids). Targets: classes
    are int64 labels 0..C-1 (``classes``: C); values float32 of any shape per sample
    (``classes``: a target's size); tokens int64 ids under the vocabulary (``classes``:
    ``data.vocab_size``, else the given one, else the largest id + 1)."""
    form = form or DataForm()
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 1 or y.ndim < 1:
        raise InputError(
            f"{_named(spec)}: inputs of shape {x.shape} and targets of shape {y.shape}; give "
            "inputs (samples, ...) and targets (samples, ...)"
        )
    if x.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise InputError(f"{_named(spec)}: inputs and targets must be numbers")
    if len(x) != len(y) or len(x) == 0:
        raise InputError(f"{_named(spec)}: {len(x)} rows of inputs but {len(y)} targets")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        raise InputError(f"{_named(spec)}: inputs contain NaN or infinity")
    if shape is not None and math.prod(shape) != math.prod(x.shape[1:]):
        raise InputError(f"{_named(spec)}: in_shape {shape} does not fit samples of {x.shape[1:]}")
    # features are float32 for classification and regression, whatever they were stored
    # as (uint8 pixels); integers stay integers (token ids) for the others
    floating = x.dtype.kind == "f" or form.targets in FEATURES
    x = x.astype(np.float32 if floating else np.int64, copy=False)
    shape = shape or tuple(x.shape[1:])
    targets = form.targets
    if targets == "any":  # the author's objective knows its targets: none refused here
        if y.dtype.kind == "f":
            return x, y.astype(np.float32, copy=False), shape, math.prod(y.shape[1:])
        yi = y.astype(np.int64, copy=False)
        top = max(int(yi.max(initial=0)), int(x.max(initial=0)) if x.dtype.kind in "iu" else 0)
        return x, yi, shape, max(classes, form.vocab_size or 0, top + 1)
    if targets == "values":
        if y.dtype.kind != "f":
            raise InputError(
                f"{_named(spec)}: the targets are integers ({y.dtype}), which regression "
                "would fit as real values; use objective.name: classification for classes, "
                "or store the targets as floats"
            )
        if not np.all(np.isfinite(y)):
            raise InputError(f"{_named(spec)}: targets contain NaN or infinity")
        return x, y.astype(np.float32, copy=False), shape, math.prod(y.shape[1:])
    if targets == "tokens":
        return x, _ids(spec, x, y, classes, form), shape, _vocab(spec, x, y, classes, form)
    if y.ndim != 1:
        raise InputError(
            f"{_named(spec)}: targets of shape {y.shape}; classification takes one class per "
            "sample (samples,); use objective.name: regression for targets of other shapes"
        )
    yi = y.astype(np.int64)
    if not np.array_equal(yi, y) or yi.min() < 0:
        raise InputError(
            f"{_named(spec)}: labels must be integers 0..C-1 for classification (found "
            f"e.g. {y[~np.equal(yi, y) | (yi < 0)][:3].tolist()}); for real-valued targets "
            "use objective.name: regression"
        )
    if not classes:  # a source (not a prepared split, which may lack a class): 0..C-1
        check_classes(spec, yi)
    classes = max(classes, int(yi.max()) + 1)
    return x, yi, shape, classes


def _vocab(spec: str, x: np.ndarray, y: np.ndarray, given: int, form: DataForm) -> int:
    if form.vocab_size:
        return form.vocab_size
    return given or int(max(x.max(initial=0), y.max(initial=0))) + 1


def _ids(spec: str, x: np.ndarray, y: np.ndarray, given: int, form: DataForm) -> np.ndarray:
    """The target token ids as int64, inputs and targets checked against the vocabulary."""
    if x.dtype.kind not in "iu" or y.dtype.kind not in "biu":
        raise InputError(
            f"{_named(spec)}: a language model reads token ids (integers), not inputs of "
            f"{x.dtype} and targets of {y.dtype}"
        )
    vocab = _vocab(spec, x, y, given, form)
    top = int(max(x.max(initial=0), y.max(initial=0)))
    if top >= vocab or min(x.min(initial=0), y.min(initial=0)) < 0:
        field = "data.vocab_size" if form.vocab_size else "the vocabulary"
        raise InputError(
            f"{_named(spec)}: token id {top} is at or above {field} ({vocab}); raise "
            "data.vocab_size above the largest id, or fix the ids"
        )
    return y.astype(np.int64, copy=False)


def standardization(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) per feature of the training samples (given in the order of their
    index in the source), a constant feature's std 1: the one normalisation,
    ``(x - mean) / std``, of the trainer and the data-prep stage, arrays or a Dataset
    (:class:`.samples.RunningStats`, the same bits for the same samples)."""
    stats = RunningStats()
    stats.add(x_train)
    return stats.result(x_train.shape[1:])


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
            raise InputError(f"data {spec!r}: not a rectangular CSV ({e})") from e
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


def load_dataset(
    spec: str,
    test_fraction: float,
    seed: int,
    normalize: bool = True,
    form: DataForm | None = None,
) -> Dataset:
    """Load, split (seeded), and standardise with statistics of the training part only.

    ``spec``: 'digits', a file, a factory (``package.module:function``), or a split the
    data-prep stage wrote of a factory's Dataset (its indices, read here as samples)."""
    form = form or DataForm()
    split = _prepared_split(spec, form)
    if split is not None:  # a split of a Dataset's: its positions shuffled as rows are
        samples, shape, classes = split
        order = np.random.default_rng(seed).permutation(len(samples))
        n_test = round(len(samples) * test_fraction)
        part = {"train": order[n_test:], "test": order[:n_test]}
        parts = (samples.subset(part[k]) for k in ("train", "test"))
        return Dataset(*parts, shape, classes, form)
    if is_factory(spec):
        src = open_source(spec)
        if not isinstance(src, tuple):
            return _dataset_of(spec, src, test_fraction, seed, normalize, form)
    x, y, shape, classes = read_arrays(spec, form)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    xtr, xte = x[train], x[test]
    if normalize and x.dtype.kind == "f":  # token ids stay ids
        mean, std = standardization(x[np.sort(train)])
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
    return Dataset(
        ArraySamples(torch.from_numpy(np.ascontiguousarray(xtr)), torch.from_numpy(y[train])),
        ArraySamples(torch.from_numpy(np.ascontiguousarray(xte)), torch.from_numpy(y[test])),
        shape,
        classes,
        form,
    )


def _dataset_of(
    spec: str, ds: object, test_fraction: float, seed: int, normalize: bool, form: DataForm
) -> Dataset:
    """A factory's Dataset used directly (a TrainConfig's ``data``, no data-prep stage):
    split as arrays are, its items checked against ``form`` and the training part's
    statistics computed in one pass (:func:`.samples.scan_items`; every rank makes it)."""
    n = len(ds)  # type: ignore[arg-type]
    order = np.random.default_rng(seed).permutation(n)
    n_test = round(n * test_fraction)
    test, train = order[:n_test], order[n_test:]
    scan = scan_items(spec, ds, form, train, normalize)
    return Dataset(
        DatasetSamples(ds, train, scan.mean, scan.std, spec, form.targets),
        DatasetSamples(ds, test, scan.mean, scan.std, spec, form.targets),
        scan.in_shape,
        scan.classes,
        form,
    )


def _prepared_split(
    spec: str, form: DataForm
) -> tuple[DatasetSamples, tuple[int, ...], int] | None:
    """A split file of a Dataset factory's (``index`` and the rest, see :mod:`.samples`)
    as samples whose items are checked against ``form``, or None for any other kind of
    data."""
    if is_factory(spec) or not spec.endswith(".npz") or not Path(spec).is_file():
        return None
    with np.load(spec, allow_pickle=False) as z:
        if "index" not in z.files:
            return None
        factory, code_dir = str(z["factory"]), str(z["code_dir"])
        index, mean, std = z["index"], z["mean"], z["std"]
        shape, classes = tuple(int(v) for v in z["in_shape"]), int(z["classes"])
    ds = open_source(factory, (code_dir or None,))
    if isinstance(ds, tuple):
        raise InputError(
            f"data.source {factory!r}: the factory returned a Dataset when {spec} was "
            "prepared, and now a pair of arrays; prepare the data again"
        )
    return DatasetSamples(ds, index, mean, std, factory, form.targets), shape, classes


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
