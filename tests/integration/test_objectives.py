"""Regression and language modelling on every strategy, on real ranks: 2 ranks and a
2-stage pipeline of 4 microbatches train what one process trains; a killed rank's run
resumes bit for bit; an elastic world that shrinks equals the smaller world's run.
Each run also trains with the recipe (issue 34): an LR schedule with warmup, global-norm
clipping, gradient accumulation across ranks, bf16 and early stopping through the kill.
(Classification's are the other files' tests: test_ranks, test_pipelining, test_elastic.)
Nothing here is mocked."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import pytest
import torch

from dagtrain.launch import RankFailure
from dagtrain.training import TrainConfig, run_training
from dagtrain.training.rank import checkpoint as ckpt

from .faults import Faults

pytestmark = pytest.mark.slow
QUIET = {"on_line": lambda line: None}
CORPUS = Path(__file__).resolve().parents[2] / "dags" / "data" / "corpus.txt"
TEXT = 16_000  # bytes of it trained on: 999 windows of 16, 25 steps an epoch of 32
COUNTED = "tests.integration.objective_models:counted"  # a built-in, counting its steps

OBJECTIVES = {
    # diabetes: 354 training samples, 12 steps an epoch of 32
    "regression": {
        "objective": "regression",
        "data": "diabetes",
        "model": COUNTED,
        "model_args": {"kind": "mlp", "hidden": [32, 32]},
        "lr": 0.0001,
    },
    # the project's text in windows of 16 bytes (its first TEXT bytes: the `text` fixture)
    "language_model": {
        "objective": "language_model",
        "data": "text.txt",
        "sequence_length": 16,
        "model": COUNTED,
        "model_args": {"kind": "transformer", "dim": 32, "heads": 2, "layers": 2},
        "lr": 0.1,
    },
}
METRICS = {"regression": ("mse", "mae", "r2"), "language_model": ("perplexity", "accuracy")}
# global-norm clipping that clips some steps of each (their mean norms: ~700-4400, ~0.9)
CLIP = {"regression": {"max_grad_norm": 2000.0}, "language_model": {"max_grad_norm": 1.0}}
SCHEDULE = {"lr_schedule": "cosine", "warmup_ratio": 0.2, "min_lr_ratio": 0.1}


def config(objective: str, tmp: Path, **kw) -> TrainConfig:
    base = {
        **OBJECTIVES[objective],
        "data": str(tmp.parent / OBJECTIVES[objective]["data"])
        if objective == "language_model"
        else OBJECTIVES[objective]["data"],
        "batch_size": 32,
        "bucket_mb": 0.01,
        "collective_timeout": 30,
        "checkpoint_dir": str(tmp / "ckpt"),
        "status_dir": str(tmp / "ranks"),
        "metrics_file": str(tmp / "metrics.jsonl"),
    }
    return TrainConfig(**{**base, **kw})


def final_params(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return ckpt.latest(cfg.checkpoint_dir)[1]["model"]


@pytest.fixture(autouse=True)
def text(tmp_path) -> Path:
    """The start of the project's text, beside every run's folder."""
    path = tmp_path / "text.txt"
    path.write_bytes(CORPUS.read_bytes()[:TEXT])
    return path


@pytest.fixture(autouse=True)
def steps_folder(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "steps"
    folder.mkdir()
    monkeypatch.setenv("DAGTRAIN_BENCH_STEPS", str(folder))
    return folder


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_two_ranks_and_a_two_stage_pipeline_train_what_one_process_trains(tmp_path, objective):
    # regression: early stopping that no epoch after the first satisfies, so the ranks
    # stop after 2 of 3 epochs together and keep the first epoch's model
    stop = {"metric": "mse", "patience": 1, "min_delta": 1e9}
    steps = (
        {"epochs": 3, "early_stopping": stop}
        if objective == "regression"
        else {"epochs": 1, "max_steps": 8}
    )
    steps |= SCHEDULE | CLIP[objective]  # the LR of the global step; the whole model's norm
    dp_backend, pp_backend = ("mpi", "torch") if objective == "regression" else ("torch", "mpi")
    one = config(objective, tmp_path / "one", **steps)
    # 2 ranks accumulating 2 chunks each = 1 process in one chunk
    two = config(
        objective, tmp_path / "two", backend=dp_backend, ranks=2, accumulation_steps=2, **steps
    )
    pipe = config(
        objective,
        tmp_path / "pipe",
        backend=pp_backend,
        ranks=2,
        parallel={"stages": 2, "microbatches": 4, "order": "1f1b"},
        **steps,
    )
    results = {name: run_training(c, **QUIET) for name, c in (("one", one), ("two", two))}
    results["pipe"] = run_training(pipe, **QUIET)
    assert results["pipe"].pipeline["stages"] == 2
    want = final_params(one)
    for name, c in (("two", two), ("pipe", pipe)):
        got = final_params(c)
        worst = max(float((got[k] - v).abs().max()) for k, v in want.items())
        for k, v in want.items():
            assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), (name, k, worst)
    if objective == "regression":  # two closed epochs: the objective's figures agree
        for name in ("two", "pipe"):
            for mine, theirs in zip(results[name].epochs, results["one"].epochs):
                for m in ("train_loss", *(f"train_{x}" for x in METRICS[objective])):
                    assert mine[m] == pytest.approx(theirs[m], rel=1e-5), (name, m)
                for m in ("lr", "grad_norm", "clip_rate", "clip_factor"):  # the recipe's agree
                    assert mine[m] == pytest.approx(theirs[m], rel=1e-5), (name, m)
                assert mine["test_mse"] == pytest.approx(theirs["test_mse"], rel=1e-5)
        for name, res in results.items():  # stopped together, the first epoch's model kept
            assert len(res.epochs) == 2 and res.early_stop["stopped_after_epoch"] == 1, name
            assert res.early_stop["best_epoch"] == 0 and res.checkpoint.endswith("12.pt"), name
            assert res.params_sha256 == ckpt.state_digest(ckpt.load(res.checkpoint)["model"])
        row = results["one"].epochs[-1]
        assert math.isclose(row["train_loss"], row["train_mse"])
        assert 0 < row["clip_rate"] < 1 and row["lr"] < results["one"].epochs[0]["lr"]
        assert row["test_units"] == row["test_samples"] == 88  # one value per sample


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_a_killed_rank_fails_named_and_the_run_resumes_bitwise(tmp_path, objective):
    steps = {"epochs": 4} if objective == "regression" else {"epochs": 2}
    recipe = {
        **SCHEDULE, **CLIP[objective], "precision": "bf16", "accumulation_steps": 2,
        "early_stopping": {"metric": "loss", "patience": 10},
    }  # fmt: skip
    kw = {"backend": "torch", "ranks": 2, "checkpoint_every": 5, **steps, **recipe}
    whole = run_training(config(objective, tmp_path / "whole", **kw), **QUIET)
    cfg = config(objective, tmp_path / "killed", **kw)
    faults = Faults((1, 22, signal.SIGKILL))
    with pytest.raises(RankFailure) as info:
        run_training(cfg, on_start=faults, **QUIET)
    assert faults.sent, "rank 1 was never killed"
    assert info.value.rank == 1 and info.value.signal == "SIGKILL", str(info.value)
    resumed = run_training(cfg, **QUIET)
    assert resumed.resumed_from_step is not None and 5 <= resumed.resumed_from_step <= 20
    assert resumed.steps == whole.steps
    assert resumed.params_sha256 == whole.params_sha256  # bitwise
    assert resumed.epochs == whole.epochs  # every figure of every epoch, exactly
    assert resumed.early_stop == whole.early_stop and "lr" in whole.epochs[-1]
    assert not faults.left()


@pytest.mark.alone  # a rank killed at a step, 10 s collective deadlines: the whole machine
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_an_elastic_world_that_shrinks_equals_the_smaller_worlds_run(tmp_path, objective):
    steps = {"epochs": 5} if objective == "regression" else {"epochs": 3}
    # a warmup that does not depend on the run's length (the reference stops at step k)
    recipe = {"warmup_steps": 6, **CLIP[objective], "accumulation_steps": 2}
    kw = {"backend": "torch", "collective_timeout": 10, **steps, **recipe}
    cfg = config(objective, tmp_path / "elastic", ranks=2, min_ranks=1, **kw)
    faults = Faults((1, 15, signal.SIGKILL), (1, 15, signal.SIGKILL))
    res = run_training(cfg, on_start=faults, **QUIET)
    restart, shrink = res.world_changes
    assert (restart["change"], restart["from"], restart["to"]) == ("restart", 2, 2), restart
    assert (shrink["change"], shrink["from"], shrink["to"]) == ("shrink", 2, 1), shrink
    assert res.world == 1 and not faults.left()
    k = shrink["step"]
    # the reference: 2 ranks to step k, then 1 rank from there, on the same global batch
    run_training(config(objective, tmp_path / "ref", ranks=2, max_steps=k, **kw), **QUIET)
    again = run_training(config(objective, tmp_path / "ref", ranks=1, **kw), **QUIET)
    assert again.resumed_from_step == k
    assert res.params_sha256 == again.params_sha256  # bit for bit
    last = res.epochs[-1]
    for m in METRICS[objective]:
        assert math.isfinite(last[f"train_{m}"]) and f"test_{m}" in last, last


def test_the_three_backends_train_a_language_model_bitwise_alike(tmp_path):
    digests = {}
    for backend in ("torch", "mpi", "horovod"):  # in bf16, as they do in fp32 (test_ranks)
        cfg = config(
            "language_model", tmp_path / backend, backend=backend, ranks=2, max_steps=6,
            precision="bf16",
        )  # fmt: skip
        r = run_training(cfg, **QUIET)
        assert (r.world, r.backend, r.steps) == (2, backend, 6)
        digests[backend] = r.params_sha256
    assert len(set(digests.values())) == 1, digests
