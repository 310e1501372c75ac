"""The one way a record is made from a JSON document and written back: its declared
fields taken; a field it does not declare (a newer version wrote it) ignored, or, for a
record with an ``extra`` field (one that is read, changed and written again), kept
there and written back as it was."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

__all__ = ["from_doc", "from_doc_or_none", "to_doc"]

T = TypeVar("T")


@functools.cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def from_doc(cls: type[T], doc: dict[str, Any]) -> T:
    """``cls`` (a dataclass) from ``doc``; TypeError when a required field is missing."""
    names = _names(cls)
    known = {k: v for k, v in doc.items() if k in names and k != "extra"}
    if "extra" in names:
        known["extra"] = {k: v for k, v in doc.items() if k not in names}
    return cls(**known)


def from_doc_or_none(cls: type[T], doc: Any) -> T | None:
    """:func:`from_doc`, or None when ``doc`` is not an object or lacks a required field."""
    if not isinstance(doc, dict):
        return None
    try:
        return from_doc(cls, doc)
    except TypeError:
        return None


def to_doc(record: Any) -> dict[str, Any]:
    """The record's fields as a JSON object, its ``extra`` ones (if any) beside them."""
    doc = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    extra = doc.pop("extra", None) or {}
    return {**extra, **{k: _plain(v) for k, v in doc.items()}}


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return to_doc(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v
