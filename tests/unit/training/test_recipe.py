"""The training recipe in one process: the LR schedule as a function of the step,
clipping equal to torch's ``clip_grad_norm_``, accumulation equal to one chunk, bf16
deterministic, early stopping keeping and restoring the best epoch, and the refusals
that need the data (a warmup longer than the run)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dagtrain.config import TrainingConfig
from dagtrain.errors import InputError
from dagtrain.training import TrainConfig, train
from dagtrain.training.rank import checkpoint
from dagtrain.training.rank.data import data_form, load_dataset, shard_batches
from dagtrain.training.rank.models import build_model
from dagtrain.training.rank.recipe import clip_factor, lr_at

# digits: 1437 training samples, 23 steps an epoch of 64
BASE = {"model": "mlp", "model_args": {"hidden": [32]}, "batch_size": 64, "bucket_mb": 0.001}


def test_the_lr_rises_through_the_warmup_then_decays_to_the_minimum():
    t = TrainingConfig(lr=0.1, warmup_steps=4, lr_schedule="cosine", min_lr_ratio=0.1)
    lrs = [lr_at(t, s, 20) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert lrs[4] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.01)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))  # decays, never rises
    mid = TrainingConfig(lr=0.1, lr_schedule="linear", min_lr_ratio=0.0)
    assert lr_at(mid, 5, 11) == pytest.approx(0.05)  # halfway through 11 steps
    ratio = TrainingConfig(lr=0.1, warmup_ratio=0.25)  # constant after a quarter
    assert [lr_at(ratio, s, 8) for s in (0, 1, 2, 7)] == pytest.approx([0.05, 0.1, 0.1, 0.1])


def test_clipping_matches_torch_clip_grad_norm_on_the_same_gradient(tmp_path):
    cfg = TrainConfig(
        **BASE, max_steps=1, lr=0.5, momentum=0.0, max_grad_norm=0.05,
        checkpoint_dir=str(tmp_path),
    )  # fmt: skip
    train(cfg)
    got = checkpoint.latest(tmp_path)[1]["model"]
    # the reference: the same model, the same first batch, torch's clipping, plain SGD
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=[32])
    ds = load_dataset("digits", 0.2, 0, True, data_form(cfg))
    idx, _ = shard_batches(len(ds.train), 64, 0, 1, 0, 0)[0]
    x, y = ds.train.batch(idx)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05))
    assert norm > 0.05 and clip_factor(norm, 0.05) < 1  # it clipped
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    for k, v in model.state_dict().items():
        assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-7), k


def test_accumulating_two_chunks_trains_what_one_chunk_trains(tmp_path):
    kw = {**BASE, "epochs": 1, "lr_schedule": "cosine", "warmup_steps": 3, "max_grad_norm": 0.5}
    one = TrainConfig(**kw, checkpoint_dir=str(tmp_path / "one"))
    two = TrainConfig(**kw, accumulation_steps=2, checkpoint_dir=str(tmp_path / "two"))
    a, b = train(one), train(two)
    want, got = (checkpoint.latest(c.checkpoint_dir)[1]["model"] for c in (one, two))
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6), k
    for m in ("train_loss", "train_accuracy", "grad_norm", "clip_rate", "clip_factor", "lr"):
        assert b.epochs[0][m] == pytest.approx(a.epochs[0][m], rel=1e-5), m
    row = a.epochs[0]
    assert 0 < row["clip_rate"] <= 1 and 0 < row["clip_factor"] < 1  # some steps clipped


def test_bf16_is_deterministic_and_not_fp32():
    kw = {**BASE, "max_steps": 6, "epochs": 1}
    bf = [train(TrainConfig(**kw, precision="bf16")).params_sha256 for _ in range(2)]
    fp = train(TrainConfig(**kw)).params_sha256
    assert bf[0] == bf[1] != fp


def test_early_stopping_keeps_and_restores_the_best_epoch(tmp_path):
    # min_delta so large that no epoch after the first improves on it: stop after the
    # second (patience 1), the first epoch's model kept though keep_checkpoints is 1
    cfg = TrainConfig(
        **BASE,
        epochs=5,
        keep_checkpoints=1,
        early_stopping={"metric": "loss", "patience": 1, "min_delta": 100.0},
        checkpoint_dir=str(tmp_path / "ckpt"),
        metrics_file=str(tmp_path / "metrics.jsonl"),
        trace_dir=str(tmp_path / "traces"),
    )
    res = train(cfg)
    # the step it stopped after is the run's last: its trace is the last step's, as the
    # page opens it first (the epoch before keeps its own)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert res.trace.endswith("step-rank0.json") and traces == [
        "step-rank0.json",
        "step0000023-rank0.json",
    ], traces
    per_epoch = math.ceil(1437 / 64)
    assert len(res.epochs) == 2 and res.steps == 2 * per_epoch  # stopped early
    stop = res.early_stop
    assert stop["metric"] == "test_loss" and stop["best_epoch"] == 0
    assert stop["stopped_after_epoch"] == 1 and "did not improve" in stop["why"]
    assert stop["best"] == res.epochs[0]["test_loss"]
    assert res.checkpoint.endswith(f"{per_epoch:08d}.pt"), res.checkpoint
    best = checkpoint.load(res.checkpoint)["model"]
    assert res.params_sha256 == checkpoint.state_digest(best)  # the run's model: the best
    end = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert end["kind"] == "end" and end["early_stop"] == stop  # for a tail of the file too
    kept = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt"))
    assert kept == [f"ckpt-{per_epoch:08d}.pt", f"ckpt-{2 * per_epoch:08d}.pt"], kept
    again = train(cfg)  # a retry of the stopped run: it stops again, training nothing
    assert again.resumed_from_step == res.steps == again.steps
    assert again.params_sha256 == res.params_sha256 and again.early_stop == stop


def test_early_stopping_without_a_stop_says_it_ran_to_the_end():
    res = train(TrainConfig(**BASE, epochs=2, early_stopping={"patience": 5}))
    assert len(res.epochs) == 2 and res.early_stop["stopped_after_epoch"] is None
    assert res.early_stop["metric"] == "test_accuracy"  # the objective's first metric
    assert res.early_stop["better"] == "higher"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"epochs": 1, "warmup_steps": 23}, "training.warmup_steps"),
        ({"epochs": 2, "warmup_steps": 50}, "training.warmup_steps"),
    ],
)
def test_a_warmup_not_shorter_than_the_run_is_refused_before_a_step(kw, field):
    with pytest.raises(InputError, match=field) as info:
        train(TrainConfig(**BASE, **kw))
    assert "not shorter than the run" in str(info.value)


def test_an_authors_objective_early_stopping_metric_it_lacks_is_refused():
    cfg = TrainConfig(
        **BASE,
        epochs=1,
        objective={"name": "tests.unit.training.factory:loss_only"},
        early_stopping={"metric": "accuracy"},
    )
    with pytest.raises(InputError, match=r"training\.early_stopping\.metric 'accuracy'"):
        train(cfg)


def test_fp16_is_refused_on_a_rank_without_a_gpu():
    with pytest.raises(InputError, match=r"training\.precision fp16 needs a CUDA device"):
        train(TrainConfig(**BASE, max_steps=1, precision="fp16", device="auto"))


def test_the_fp16_loss_scale_is_divided_out_in_the_averages_one_pass():
    from dagtrain.training.rank.step import _average_checked, make_buckets

    b = make_buckets(torch.nn.Linear(4, 2), 25)[0]
    b.flat.fill_(8.0)  # the sum over 2 ranks of gradients scaled by 4
    b.inv = torch.full((1,), 0.5 / 4.0)
    assert _average_checked(b, 2, 0.5, 4.0) and bool((b.flat == 1.0).all())
    b.flat[0] = float("inf")  # an overflow: the step is skipped, the scale halved
    assert not _average_checked(b, 2, 0.5, 4.0)


def test_champion_without_a_registry_is_refused_by_a_rank_alone():
    # (a pipeline's train phase gives its ranks the champion's file, or scratch)
    with pytest.raises(InputError, match="a training run alone has no model registry"):
        train(TrainConfig(**BASE, max_steps=1, init="champion"))
