"""The step graph in one process (local backend): overlap, buckets, non-finite policy."""

from __future__ import annotations

import json

import pytest

from dagtrain.taskgraph import TaskError
from dagtrain.training import TrainConfig, train
from dagtrain.training.rank.step import NonFiniteGradients


def cfg(**kw):
    base = {"epochs": 1, "max_steps": 8, "bucket_mb": 0.02, "model_args": {"hidden": [64]}}
    return TrainConfig(**{**base, **kw})


def test_overlap_on_and_off_give_bitwise_equal_parameters():
    on = train(cfg(overlap=True))
    off = train(cfg(overlap=False))
    assert on.params_sha256 == off.params_sha256
    assert on.steps == off.steps == 8


def test_bucket_size_does_not_change_the_result():
    assert train(cfg(bucket_mb=0.001)).params_sha256 == train(cfg(bucket_mb=100)).params_sha256


def test_nonfinite_fail_names_step_and_bucket():
    with pytest.raises(TaskError, match=r"step 0: non-finite gradients in bucket \d") as info:
        train(cfg(model="tests.unit.training.factory:nan", model_args={}))
    assert isinstance(info.value.__cause__, NonFiniteGradients)


def test_nonfinite_skip_skips_every_bad_step_and_counts_it():
    r = train(
        cfg(model="tests.unit.training.factory:nan", model_args={}, nonfinite="skip", max_steps=3)
    )
    assert r.steps == 3 and r.skipped_steps == 3


def test_digits_trains_in_process_and_writes_a_step_trace(tmp_path):
    r = train(TrainConfig(epochs=3, trace_dir=str(tmp_path), bucket_mb=0.05))
    assert r.test_accuracy >= 0.95
    assert [e["epoch"] for e in r.epochs] == [0, 1, 2]
    events = json.loads((tmp_path / "step-rank0.json").read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    process = next(e for e in events if e["name"] == "process_name")
    assert (process["pid"], process["args"]["name"]) == (0, "rank 0")
    assert {"forward-backward", "load-next"} <= names
    # several buckets: the overlapped step, or the plain one where the trial found it faster
    assert {"allreduce[0]", "update[0]"} <= names or {"allreduce", "update"} <= names


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="backend"):
        TrainConfig(backend="nccl2")
    with pytest.raises(ValueError, match="neither a built-in"):
        TrainConfig(model="resnet9000")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)


def test_one_bucket_runs_the_plain_step(tmp_path):
    r = train(cfg(bucket_mb=100, trace_dir=str(tmp_path)))
    events = json.loads((tmp_path / "step-rank0.json").read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"forward-backward", "allreduce", "update"} <= names and r.steps == 8


def test_the_command_line_trains_and_refuses_a_bad_config(tmp_path, capsys):
    from dagtrain.training.__main__ import main

    assert main(["--backend", "local", "--epochs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy 0." in out and "epoch 0" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"backend": "local", "lr": -1}')
    assert main(["--config", str(bad)]) == 2
    assert "lr" in capsys.readouterr().err
