"""The DAG author's code named in a config (``"package.module:factory"``: a model's,
an objective's), imported where the ranks run, and an error that says where it looked."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from dagtrain.errors import InputError

__all__ = ["import_factory"]


def _code_path() -> list[str]:
    from dagtrain.rank_env import CODE_PATH

    return [f for f in os.environ.get(CODE_PATH, "").split(os.pathsep) if f]


def import_factory(name: str, field: str) -> Callable[..., Any]:
    """``"pkg.module:factory"`` imported (a model's, an objective's); InputError naming
    ``field`` and where it looked otherwise."""
    mod, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        if isinstance(e, AttributeError):
            why = f"module {mod!r} has no {attr!r}"
        elif isinstance(e, ModuleNotFoundError) and e.name == mod.partition(".")[0]:
            why = f"no module {mod!r} can be imported here ({e})"
        else:
            why = f"importing {mod!r} failed here: {type(e).__name__}: {e}"
        where = os.pathsep.join(
            [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *_code_path()]
        ).strip(os.pathsep)
        raise InputError(
            f"{field} {name!r}: cannot import {attr!r} from {mod!r} ({why}); "
            f"looked in the installed packages, the current folder ({os.getcwd()})"
            f"{' and ' + where if where else ''}. "
            "Put the module next to "
            "the config or DAG file (or in Airflow's plugins folder), or install it "
            "where the ranks run"
        ) from e
