"""benchmarks/data_source.py runs end to end with tiny sizes and writes its JSON (the
figures themselves are the benchmark's, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_smoke_run_writes_every_source_and_the_same_parameters(tmp_path):
    out = tmp_path / "data_source.json"
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/data_source.py",
            "--steps",
            "6",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    got = json.loads(out.read_text())
    assert set(got["systems"]) == {
        "arrays",
        "dataset",
        "dataset, 2 workers",
        "slow dataset",
        "slow dataset, 2 workers",
    }
    assert got["same_parameters"] is True
    assert all(s["samples_per_second"] > 0 for s in got["systems"].values())
