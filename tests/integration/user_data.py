"""A DAG author's data module, imported by path in the tests: the digits as a map-style
Dataset, as a pair of arrays, and factories that break the rules one way each."""

from __future__ import annotations

import numpy as np
import torch


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float32).reshape(-1, 1, 8, 8), d.target.astype(np.int64)


class Digits(torch.utils.data.Dataset):
    """Reads an item only when asked for it; counts what it was asked."""

    def __init__(self) -> None:
        self.x, self.y = _digits()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.x[i]), int(self.y[i])


def dataset() -> Digits:
    return Digits()


def arrays() -> tuple[np.ndarray, np.ndarray]:
    return _digits()


def save_npz(path) -> None:
    x, y = _digits()
    np.savez(path, x=x, y=y)


def number() -> int:
    return 3


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.zeros(4), 0


def stream() -> _Stream:
    return _Stream()


class _Items(torch.utils.data.Dataset):
    def __init__(self, item) -> None:
        self.item = item

    def __len__(self) -> int:
        return 600

    def __getitem__(self, i: int):
        return self.item(i)


def single() -> _Items:  # an item that is not a pair
    return _Items(lambda i: (torch.zeros(4),))


def ragged() -> _Items:  # item 300 on has another shape
    return _Items(lambda i: (torch.zeros(4 if i < 300 else 5), i % 2))


def fractional() -> _Items:  # a label that is not a class
    return _Items(lambda i: (torch.zeros(4), 0.5))


def text() -> _Items:  # features that are not numbers
    return _Items(lambda i: (np.array(["a", "b"]), 0))


def raises() -> None:
    raise RuntimeError("bucket credentials expired")


def unpicklable() -> _Items:  # good items, but a lambda inside: no worker can receive it
    return _Items(lambda i: (torch.zeros(4), i % 2))
