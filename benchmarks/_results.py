"""Where a benchmark script writes its JSON: ``--out`` where given; else, for a
``--quick`` smoke run, the temporary folder (a smoke run's figures must never replace
the committed ones); else ``benchmarks/results/<name>.json``."""

from __future__ import annotations

import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(name: str, out: str | None, quick: bool) -> Path:
    if out is not None:
        return Path(out)
    if quick:
        return Path(tempfile.gettempdir()) / f"{name}.quick.json"
    return RESULTS / f"{name}.json"


def out_help(name: str) -> str:
    return f"default: benchmarks/results/{name}.json (with --quick: the temporary folder)"
