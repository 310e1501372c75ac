"""A record's JSON file: written whole and atomically, read strictly or tolerantly.
Standard library only (and ``dagtrain.atomic``): a rank's status record uses it before
anything else is imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dagtrain.atomic import atomic_write

__all__ = ["read_doc", "read_json", "read_object", "write_json"]


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_doc(path: Path) -> dict[str, Any] | None:
    """A JSON object's file; None where there is none. A file that cannot be read
    raises (OSError), one that is not a JSON object raises ValueError naming it: a
    record that is read, changed and written back is never rebuilt from nothing."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}); restore it or move it away") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__}, not an object")
    return data


def read_object(path: Path) -> dict[str, Any]:
    """A JSON object's file, or {} where there is none, it cannot be read or it holds
    something else (the tolerant read of a record another part may not have written)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
