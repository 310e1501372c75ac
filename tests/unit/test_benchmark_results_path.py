"""A benchmark's ``--quick`` smoke run never writes over the committed results."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks._results import RESULTS, results_path


def test_a_smoke_run_writes_to_the_temporary_folder_unless_told_where():
    quick = results_path("pipeline_throughput", None, quick=True)
    assert quick.parent == Path(tempfile.gettempdir()) and quick.parent != RESULTS
    assert results_path("pipeline_throughput", None, quick=False) == (
        RESULTS / "pipeline_throughput.json"
    )
    assert results_path("x", "/some/where.json", quick=True) == Path("/some/where.json")
