"""benchmarks/gpu_step.py on a machine without a GPU: it refuses before any work, and its
hidden CPU smoke mode runs the measurement (and, slow, the ``dagtrain run``) to a JSON
of the documented shape. No timings are asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_step.py"
SYSTEMS = {"dagtrain", "torch", "torch-async"}


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine with one
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_cuda_it_refuses_in_one_line_before_any_work(tmp_path):
    out = tmp_path / "gpu_step.json"
    r = _run("--steps", "1", "--out", str(out))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "no CUDA device found" in lines[0]
    assert "dagtrain run" in lines[0] and "plain PyTorch" in lines[0]  # what it measures
    assert r.stdout == ""  # nothing measured, nothing printed
    assert not out.exists()


def test_cpu_smoke_mode_never_writes_into_results():
    results = ROOT / "benchmarks" / "results" / "gpu_step.json"
    before = results.stat().st_mtime_ns if results.exists() else None
    r = _run("--allow-cpu", "--steps", "1", "--no-run")
    assert r.returncode != 0 and "--out" in r.stderr
    assert (results.stat().st_mtime_ns if results.exists() else None) == before


def _check_shape(data: dict, steps: int, rounds: int) -> None:
    assert data["smoke"] is True and data["environment"]["device"] == "cpu"
    assert data["ranks"] == 1 and data["steps"] == steps and data["rounds"] == rounds
    assert data["goal"] == 0.95
    assert set(data["results"]) == {"mlp-21M", "rescnn"}
    for name, res in data["results"].items():
        assert set(res["samples_per_s"]) == SYSTEMS, name
        assert all(v > 0 for v in res["samples_per_s"].values())
        assert {k: len(v) for k, v in res["rounds_samples_per_s"].items()} == dict.fromkeys(
            SYSTEMS, rounds
        )
        assert set(res["ratios"]) == {"dagtrain_vs_torch", "dagtrain_vs_torch_async"}
        assert isinstance(res["goal_met"], bool)
        assert set(res["build_seconds"]) == SYSTEMS
        assert res["buckets"] >= 1 and isinstance(res["overlap_possible"], bool)
        # the same steps on the same batches from the same parameters: the same model
        assert res["max_parameter_difference"] == {"torch": 0.0, "torch-async": 0.0}
    assert data["results"]["mlp-21M"]["parameters"] > 20_000_000


def test_cpu_smoke_mode_measures_a_few_steps_and_writes_the_json(tmp_path):
    out = tmp_path / "gpu_step.json"
    r = _run(
        *("--allow-cpu", "--steps", "2", "--rounds", "2", "--warmup", "1", "--no-run"),
        *("--out", str(out)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    _check_shape(data, steps=2, rounds=2)
    assert data["dagtrain_run"] is None
    assert "dagtrain / torch" in r.stdout


@pytest.mark.slow
def test_cpu_smoke_mode_runs_the_digits_pipeline_through_dagtrain_run(tmp_path):
    out = tmp_path / "gpu_step.json"
    r = _run(
        *("--allow-cpu", "--steps", "1", "--rounds", "1", "--warmup", "0"),
        *("--out", str(out)),
        timeout=280,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    _check_shape(data, steps=1, rounds=1)
    run = data["dagtrain_run"]
    assert run["exit_status"] == 0 and run["timed_out"] is False, run
    assert run["sets"] == {
        "distributed.device": "cpu",
        "distributed.ranks": 1,
        "distributed.backend": "torch",
    }
    assert 0.0 < run["test_accuracy"] <= 1.0 and run["wall_seconds"] > 0
    assert run["train"]["device"] == "cpu" and run["train"]["world"] == 1
    assert run["train"]["backend"] == "torch" and run["train"]["steps"] > 0
