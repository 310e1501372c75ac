"""benchmarks/pipeline_throughput.py: its saved-activation count and split in-process
(fast), and a smoke run of the whole benchmark with tiny sizes (slow: 2-rank jobs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pipeline_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("pipeline_throughput", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_saved_bytes_counts_a_microbatch_not_its_batch_nor_the_weights():
    bench = _bench()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    batch = torch.randn(32, 8)
    count = bench._SavedBytes({p.untyped_storage().data_ptr() for p in net.parameters()})
    outs = []
    with torch.autograd.graph.saved_tensors_hooks(count.pack, count.unpack):
        for mb in batch.tensor_split(4):  # views of the batch, 8 rows each
            outs.append(net(mb).sum())
    # per microbatch: its input rows (8x8), the ReLU's output (8x16, saved once though
    # the ReLU and the next Linear both save it); weights are not activations
    per_mb = (8 * 8 + 8 * 16) * 4
    assert count.now == count.peak == 4 * per_mb
    outs.pop(0).backward()
    assert count.now == 3 * per_mb
    for out in outs:
        out.backward()
    assert count.now == 0 and count.peak == 4 * per_mb


def test_a_round_runs_each_order_next_to_torchs_schedule_of_its_family():
    bench = _bench()
    names, orders = list(bench.SCHEDULES), list(bench.ORDERS)
    jobs = bench._round_jobs(names, orders)
    assert sorted(jobs) == sorted([f"torch {n}" for n in names] + orders)
    for o, t in bench.PAIRS.items():
        i = jobs.index(o)
        assert jobs[i - 1] == f"torch {t}", (o, jobs)
    # a subset: what is asked, paired where both sides are
    assert bench._round_jobs(["Schedule1F1B"], ["gpipe", "1f1b"]) == [
        "torch Schedule1F1B",
        "1f1b",
        "gpipe",
    ]


def test_balanced_split_minimises_the_largest_part():
    bench = _bench()
    assert bench._balanced([1, 1, 1, 1], 2) == [2]
    assert bench._balanced([0, 5, 0, 5, 5, 5], 2) == [4]
    assert bench._balanced([1, 2, 3, 4, 5, 6, 7, 8], 4) == [4, 6, 7]
    sp = bench.splits("transformer", {"layers": 4, "dim": 16, "heads": 2})
    assert sp["blocks"] == 6 and sp["split2"] == [3] and len(sp["split4"]) == 3


def test_the_language_models_blocks_and_loss_are_dagtrains(tmp_path):
    bench = _bench()
    from dagtrain.training.rank.objective import LanguageModel
    from dagtrain.training.rank.step import scaled_loss

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    source = {**bench.MODELS["causal-lm"], "data": str(text), "sequence_length": 8}
    sp = bench.splits("transformer", {"layers": 2, "dim": 16, "heads": 2}, source)
    # the causal LM over the text's bytes: embedding, 2 attention blocks, head
    assert sp["blocks"] == 4 and sp["params"][0] == 256 * 16 + 8 * 16
    x, y = bench._global_batches(1, source)[0]
    assert x.shape == y.shape == (bench.BATCH, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets: the next byte
    torch.manual_seed(0)
    out = torch.randn(16, 8, 256)  # one microbatch of the global batch's logits
    ours, _ = scaled_loss(LanguageModel(), out, y[:16], bench.BATCH, 1)
    theirs = bench._loss_fn(bench._units(source))(out, y[:16])
    torch.testing.assert_close(theirs, ours)


@pytest.mark.slow
def test_smoke_run_writes_every_figure(tmp_path):
    pytest.importorskip("dagtrain.training.rank.pipelining")
    out = tmp_path / "pipeline.json"
    tiny = {"transformer": {"layers": 2, "dim": 16, "heads": 2}}
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--models",
            "transformer",
            "--model-args",
            json.dumps(tiny),
            "--schedules",
            "ScheduleGPipe,Schedule1F1B,ScheduleZBVZeroBubble",
            "--orders",
            "1f1b",
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        timeout=280,
    )
    res = json.loads(out.read_text())["results"]["transformer"]
    systems = res["systems"]
    assert set(systems) == {
        "dagtrain 1f1b",
        "torch ScheduleGPipe",
        "torch Schedule1F1B",
        "torch ScheduleZBVZeroBubble",
    }
    for name, v in systems.items():
        assert "error" not in v, (name, v)
        assert v["samples_per_s"] > 0 and v["timed_steps"] == 3
        assert len(v["peak_activation_bytes"]) == 2
    assert res["ratios"]["best_vs_torch_best"] > 0
    # round by round: the one round's ratio is the run's
    rounds = res["ratios"]["rounds"]
    assert rounds["best_vs_torch_best"] == pytest.approx([res["ratios"]["best_vs_torch_best"]])
    assert rounds["1f1b_vs_torch_Schedule1F1B"] == pytest.approx(
        [res["ratios"]["1f1b_vs_torch_Schedule1F1B"]]
    )
    ours, theirs = systems["dagtrain 1f1b"], systems["torch Schedule1F1B"]
    # the same blocks, split and microbatches: the same activations, counted alike
    assert ours["peak_activation_bytes_counted_as_torch"] == theirs["peak_activation_bytes"]
    assert ours["bubble_reported"][0] is not None
    assert systems["torch ScheduleZBVZeroBubble"]["stages_per_rank"] == [[0, 3], [1, 2]]
