"""The one way a record is made from a JSON document: its declared fields taken, a
field it does not declare (a newer version wrote it) ignored."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

__all__ = ["from_doc"]

T = TypeVar("T")


@functools.cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def from_doc(cls: type[T], doc: dict[str, Any]) -> T:
    """``cls`` (a dataclass) from ``doc``'s fields it declares; TypeError when a
    required one is missing."""
    names = _names(cls)
    return cls(**{k: v for k, v in doc.items() if k in names})
