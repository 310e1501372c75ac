"""One item of a DAG author's Dataset checked against the objective (an input of any
form: an array, or a tuple or dict of them; a target of the objective's kind), and items
of one form stacked into a batch (:mod:`.samples` reads them)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from dagtrain.config import is_factory
from dagtrain.errors import InputError

__all__ = [
    "FEATURES",
    "ItemForm",
    "as_tensors",
    "check_classes",
    "check_finite",
    "concat",
    "empty_like",
    "item_arrays",
    "leaves",
    "named",
    "stack",
    "target_kind",
]


def check_classes(spec: str, y: np.ndarray) -> None:
    """Labels are the classes 0..C-1, each of them present: labels 1..3 would otherwise
    train a model of 4 classes, one of which never appears."""
    present = np.unique(y)
    if len(present) == int(present[-1]) + 1:
        return
    missing = sorted(set(range(int(present[-1]) + 1)) - {int(v) for v in present})
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    labels = ", ".join(map(str, present[:8].tolist())) + (", ..." if len(present) > 8 else "")
    raise InputError(
        f"{named(spec)}: labels must be the classes 0..C-1, each present; the labels are "
        f"{labels} (missing: {shown}); relabel them 0..{len(present) - 1}"
    )


def named(spec: str) -> str:
    """How a message names the data: the field for a factory, else the file."""
    return f"data.source {spec!r}" if is_factory(spec) else f"data {spec!r}"


def _numbers(spec: str, what: str, a: Any) -> np.ndarray:
    """``a`` as an array of float32 (floating) or int64 (integers, booleans: token ids
    stay ids); InputError naming ``what`` when it holds no numbers."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        a = (a.float() if a.dtype == torch.bfloat16 else a).numpy()  # numpy has no bf16
    a = np.asarray(a)
    if a.dtype.kind not in "biuf":
        raise InputError(
            f"data.source {spec!r}: {what} {_are(what)} {a.dtype}, not numbers "
            "(a tensor or array of numbers)"
        )
    return a.astype(np.float32 if a.dtype.kind == "f" else np.int64, copy=False)


def _are(what: str) -> str:
    return "are" if what.endswith("features") else "is"


def _input(spec: str, i: int, x: Any) -> Any:
    """An item's input checked: one array, or a tuple, list or dict of them."""
    if isinstance(x, dict):
        if not x:
            raise InputError(
                f"data.source {spec!r}: item {i}'s input is an empty dict; give it a tensor per key"
            )
        return {k: _numbers(spec, f"item {i}'s input {k!r}", v) for k, v in x.items()}
    if isinstance(x, (tuple, list)) and any(isinstance(v, torch.Tensor | np.ndarray) for v in x):
        return type(x)(_numbers(spec, f"item {i}'s input {j}", v) for j, v in enumerate(x))
    return _numbers(spec, f"item {i}'s features", x)  # a list of numbers is one array


def _label(spec: str, i: int, y: Any) -> int:
    """An item's target as one integer class."""
    if isinstance(y, torch.Tensor | np.ndarray):
        if y.size != 1 if isinstance(y, np.ndarray) else y.numel() != 1:
            raise InputError(
                f"data.source {spec!r}: item {i}'s label has shape {tuple(y.shape)}; a "
                "label is one integer class (for targets of other shapes use "
                "objective.name: regression, or your own objective)"
            )
        y = y.item()
    if isinstance(y, bool) or not isinstance(y, numbers.Real) or int(y) != y or y < 0:
        raise InputError(
            f"data.source {spec!r}: item {i}'s label is {y!r}; labels must be integers "
            "0..C-1 (for real-valued targets use objective.name: regression)"
        )
    return int(y)


def target_kind(dtype_kind: str, sample_ndim: int) -> str:
    """What an ``any`` objective's targets are, as for arrays: real ``values`` when
    floating, else ``classes`` (one integer a sample) or ``tokens`` (integers of a
    shape)."""
    return "values" if dtype_kind == "f" else "classes" if sample_ndim == 0 else "tokens"


def _target(spec: str, i: int, y: Any, targets: str) -> int | np.ndarray:
    """An item's target as ``targets`` (a :class:`.data.DataForm`'s) says: an int class,
    float32 values or int64 token ids of any shape; ``any``: as it comes (floats as
    float32, integers as int64, unchecked: the author's objective knows them)."""
    if targets == "classes":
        return _label(spec, i, y)
    a = _numbers(spec, f"item {i}'s target", y)
    if targets == "any":  # the author's objective takes them as they come
        return a
    if targets == "values" and a.dtype.kind != "f":
        raise InputError(
            f"data.source {spec!r}: item {i}'s target is {a.dtype}, which regression would "
            "fit as real values; store the targets as floats, or use objective.name: "
            "classification for classes"
        )
    if targets == "tokens" and a.dtype.kind == "f":
        raise InputError(
            f"data.source {spec!r}: item {i}'s target is {a.dtype}; a language model's "
            "targets are token ids (integers)"
        )
    return a


# the objectives whose one-array inputs are features (float32, standardised), whatever
# their dtype: integers are token ids only for a language model or the author's own
FEATURES = ("classes", "values")


def item_arrays(spec: str, i: int, item: Any, targets: str = "any") -> tuple[Any, Any]:
    """Item ``i`` as (input, target) arrays, or InputError naming the item and what it
    should be. The input: one array (float32 when floating or for classification and
    regression; otherwise int64 when integer: token ids stay ids), or a tuple, list or
    dict of them (as they come); the target as ``targets`` (a
    :class:`.data.DataForm`'s) says: ``classes``, one int; ``values``, float32 of any
    shape; ``tokens``, int64 ids of any shape; ``any`` (the default, which checks only
    that they are numbers) as it comes."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        what = f"a {type(item).__name__}" + (
            f" of {len(item)}" if isinstance(item, (tuple, list)) else ""
        )
        raise InputError(
            f"data.source {spec!r}: item {i} is {what}, not a (features, label) pair: an "
            "item is (input, target), the input a tensor, or a tuple or dict of tensors"
        )
    x = _input(spec, i, item[0])
    if targets in FEATURES and isinstance(x, np.ndarray) and x.dtype.kind != "f":
        x = x.astype(np.float32)  # integer features (uint8 pixels): standardised as ever
    if targets == "tokens" and isinstance(x, np.ndarray) and x.dtype.kind == "f":
        raise InputError(
            f"data.source {spec!r}: item {i}'s features are {x.dtype}; a language model "
            "reads token ids (integers): give them as integers, or use another objective"
        )
    return x, _target(spec, i, item[1], targets)


def leaves(x: Any) -> list[tuple[str, Any]]:
    """The arrays (or tensors) of an input, each with what a message calls it:
    ``features`` for one array, ``input 'key'`` or ``input N`` for a dict's or a
    tuple's."""
    if isinstance(x, dict):
        return [(f"input {k!r}", v) for k, v in x.items()]
    if isinstance(x, (tuple, list)):
        return [(f"input {j}", v) for j, v in enumerate(x)]
    return [("features", x)]


def _structure(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict of {list(x)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return "one array"


class ItemForm:
    """Item 0's form (its input's structure, every array's shape and dtype, its
    target's): every later item must have it, or be named."""

    __slots__ = ("kinds", "spec", "structure", "target")

    def __init__(self, spec: str, x: Any, y: Any) -> None:
        self.spec, self.structure = spec, _structure(x)
        self.kinds = [(name, a.shape, a.dtype) for name, a in leaves(x)]
        self.target = _kind(y)

    def check(self, i: int, x: Any, y: Any) -> None:
        spec = self.spec
        if _structure(x) != self.structure:
            raise InputError(
                f"data.source {spec!r}: item {i}'s input is {_structure(x)}, item 0's "
                f"{self.structure}; every item's input must have one structure"
            )
        for (name, a), (_, shape, dtype) in zip(leaves(x), self.kinds):
            if a.shape != shape:
                have = "have" if name == "features" else "has"
                raise InputError(
                    f"data.source {spec!r}: item {i}'s {name} {have} shape {a.shape}, item "
                    f"0's {shape}; every sample must have one shape"
                )
            if a.dtype != dtype:
                raise InputError(
                    f"data.source {spec!r}: item {i}'s {name} {_are(name)} {a.dtype}, item "
                    f"0's {dtype}; give every item's in one dtype (floats, or integer ids)"
                )
        if _kind(y) != self.target:
            (shape, dtype), (shape0, dtype0) = _kind(y), self.target
            raise InputError(
                f"data.source {spec!r}: item {i}'s target is {dtype} of shape {shape}, item "
                f"0's {dtype0} of shape {shape0}; every target must have one shape and dtype"
            )


def _kind(y: Any) -> tuple[tuple[int, ...], np.dtype]:
    return (y.shape, y.dtype) if isinstance(y, np.ndarray) else ((), np.dtype(np.int64))


def stack(parts: list[Any]) -> Any:
    """Items' inputs (or targets) as one batch: arrays stacked, a dict's per key, a
    tuple's per position; int labels as an int64 array."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: stack([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(stack([p[j] for p in parts]) for j in range(len(first)))
    if isinstance(first, int):
        return np.asarray(parts, np.int64)
    return np.stack(parts)


def empty_like(part: Any) -> Any:
    """A batch of no samples of ``part``'s form (an item's input or target)."""
    if isinstance(part, dict):
        return {k: empty_like(v) for k, v in part.items()}
    if isinstance(part, (tuple, list)):
        return type(part)(empty_like(v) for v in part)
    if isinstance(part, int):
        return np.empty(0, np.int64)
    return np.empty((0, *part.shape), part.dtype)


def as_tensors(part: Any) -> Any:
    """A stacked batch's arrays as tensors (sharing their memory)."""
    if isinstance(part, dict):
        return {k: as_tensors(v) for k, v in part.items()}
    if isinstance(part, (tuple, list)):
        return type(part)(as_tensors(v) for v in part)
    return torch.from_numpy(part)


def concat(parts: list[Any]) -> Any:
    """Batches of tensors joined along the batch dimension, per key or position."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(concat([p[j] for p in parts]) for j in range(len(first)))
    return torch.cat(parts)


def check_finite(spec: str, start: int, named: list[tuple[str, np.ndarray]]) -> None:
    for name, a in named:
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            bad = start + int(np.argwhere(~np.isfinite(a.reshape(len(a), -1)))[0][0])
            hold = "hold" if name == "features" else "holds"
            raise InputError(f"data.source {spec!r}: item {bad}'s {name} {hold} NaN or infinity")
