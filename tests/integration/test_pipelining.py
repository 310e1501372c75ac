"""Pipeline parallelism in real processes (gloo, and mpi4py under mpirun): every order
trains the same parameters as one process on the same global batch, resumes bitwise
after a kill (and with another number of stages), a stage rank that dies or stalls
fails the job in time, named, and non-finite gradients fail the run naming their stage
or are skipped on every stage alike. Nothing is mocked.

The whole equivalence grid (every order, S in {2, 4}, M in {1, 4, 8}, D in {1, 2},
v in {1, 2} chunks a rank, two chunks looped or in a V) runs with ``-m pipeline_grid``;
the default run takes a subset of it."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from dagtrain.launch import RankFailure
from dagtrain.training import TrainConfig, run_training
from dagtrain.training.rank import checkpoint as ckpt
from tests.unit.training.factory import nan_last_weight

from .faults import alive, signal_rank

pytestmark = pytest.mark.slow
QUIET = {"on_line": lambda line: None}
ORDERS = ("gpipe", "1f1b", "zero-bubble")
BASE = {
    "epochs": 1,
    "max_steps": 4,
    "batch_size": 32,
    "model_args": {"hidden": [32, 32, 32]},  # 8 blocks: Flatten, then Linear/ReLU pairs
    "bucket_mb": 0.01,
    "collective_timeout": 30,
}
GRID = [
    (order, s, m, d, v, place)
    for order, s, m, d, v, place in itertools.product(
        ORDERS, (2, 4), (1, 4, 8), (1, 2), (1, 2), ("looped", "v")
    )
    # (looped interleaving: microbatches in groups of S; a V's sequence takes any M)
    if (v == 1 or order == "gpipe" or m % s == 0 or place == "v") and (place == "looped" or v == 2)
]
# the default run's part of the grid: each order with one chunk and with two (gpipe's:
# looped BFS, 1f1b's: interleaved 1F1B), both S, M and D, two backends
DEFAULT = {
    ("gpipe", 2, 4, 1, 1, "looped"),
    ("gpipe", 2, 8, 1, 2, "looped"),
    ("1f1b", 4, 8, 1, 2, "looped"),
    ("1f1b", 2, 1, 2, 1, "looped"),
    ("zero-bubble", 2, 8, 2, 2, "looped"),
    ("zero-bubble", 4, 4, 1, 1, "looped"),
    # a V: the last rank's turn in memory, the loss on rank 0 (zero-bubble: the split
    # backward through the turn, with replicas on mpi; S = 4 on gloo: ranks with no turn)
    ("zero-bubble", 2, 4, 2, 2, "v"),
    ("1f1b", 4, 4, 1, 2, "v"),
}


def final_params(directory: Path) -> dict[str, torch.Tensor]:
    return ckpt.latest(directory)[1]["model"]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, torch.Tensor]:
    d = tmp_path_factory.mktemp("single")
    run_training(TrainConfig(**BASE, checkpoint_dir=str(d)), 1, **QUIET)
    return final_params(d)


def _grid():
    for case in GRID:
        marks = [] if case in DEFAULT else [pytest.mark.pipeline_grid]
        yield pytest.param(*case, marks=marks, id="-".join(map(str, case)))


@pytest.mark.parametrize(
    ("order", "stages", "micro", "replicas", "chunks", "placement"), list(_grid())
)
def test_every_order_trains_what_one_process_trains(
    tmp_path, single, order, stages, micro, replicas, chunks, placement
):
    v = placement == "v"
    backend = "mpi" if (stages + micro + replicas + chunks) % 2 == 0 else "torch"
    cfg = TrainConfig(
        **BASE,
        backend=backend,
        ranks=stages * replicas,
        parallel={
            "stages": stages, "microbatches": micro, "order": order, "chunks": chunks,
            "placement": placement,
        },
        checkpoint_dir=str(tmp_path),
    )  # fmt: skip
    r = run_training(cfg, **QUIET)
    p = r.pipeline
    assert (p["stages"], p["replicas"], p["microbatches"], p["order"], p["chunks"]) == (
        stages,
        replicas,
        micro,
        order,
        chunks,
    )
    # rank 0's parts: looped, or the first and the last
    assert p["parts"] == ([0, 2 * stages - 1] if v else list(range(0, stages * chunks, stages)))
    assert p["placement"] == placement
    assert r.steps == 4
    got = final_params(tmp_path)
    worst = max(float((got[k] - v).abs().max()) for k, v in single.items())
    print(
        f"{order} S={stages} M={micro} D={replicas} v={chunks} {placement} on {backend}: "
        f"max |diff| {worst:.3g}"
    )
    for k, v in single.items():
        assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), (k, worst)


def test_the_orders_hold_the_activations_they_promise(tmp_path):
    # stage 0 of 2 with 8 microbatches: gpipe keeps all 8 alive, 1f1b and zero-bubble 2
    peak = {}
    for order in ORDERS:
        cfg = TrainConfig(
            **{**BASE, "max_steps": 2},
            backend="torch",
            ranks=2,
            parallel={"stages": 2, "microbatches": 8, "order": order, "split": [4]},
        )
        peak[order] = run_training(cfg, **QUIET).pipeline["peak_activation_bytes"]
    assert peak["1f1b"] * 4 == peak["gpipe"], peak
    assert peak["zero-bubble"] == peak["1f1b"], peak
    # two chunks a rank (4 parts of 2 blocks): looped BFS keeps every forward of both
    # chunks alive, interleaved 1F1B on stage 0 at most 2(S - 1) + (v - 1)S + 1 = 5 of 16
    for order in ("gpipe", "1f1b"):
        cfg = TrainConfig(
            **{**BASE, "max_steps": 2},
            backend="torch",
            ranks=2,
            parallel={"stages": 2, "microbatches": 8, "order": order, "chunks": 2,
                      "split": [2, 4, 6]},
        )  # fmt: skip
        peak[f"{order}-v2"] = run_training(cfg, **QUIET).pipeline["peak_activation_bytes"]
    assert peak["1f1b-v2"] < peak["gpipe-v2"] / 2, peak


SLOW = dict(
    model="tests.unit.training.factory:slow_blocks",
    model_args={"seconds": 0.004},
    epochs=2,
    max_steps=60,
    checkpoint_every=10,
    batch_size=32,
    collective_timeout=20,
)


def kill_at_step_20(tmp_path, monkeypatch, rank: int):
    """(the ranks' pid folder, the checkpoint folder, the kill's box, an ``on_start``
    that SIGKILLs ``rank`` once both stages' checkpoint of step 20 is whole: each stage
    writes its own shard)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(pids))
    d = tmp_path / "b"
    box: dict = {}
    both = ("ckpt-00000020.pt.json", "ckpt-00000020.stage1.pt.json")
    return pids, d, box, signal_rank(d, pids, rank, signal.SIGKILL, both, box)


@pytest.mark.parametrize("backend", ["torch", "mpi"])
def test_a_killed_stage_rank_fails_named_and_the_run_resumes_bitwise(
    tmp_path, backend, monkeypatch
):
    # order auto: each run (and the resumed one) measures gpipe and 1f1b on its first
    # steps and keeps the faster, whichever it is: they must give the same bits
    par = {"stages": 2, "microbatches": 4, "order": "auto", "split": [4]}
    cfg = dict(SLOW, backend=backend, ranks=2, parallel=par)
    whole = run_training(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a")), **QUIET)
    trial = whole.pipeline["order_trial"]
    assert trial["chosen"] in ("1f1b", "gpipe") and whole.pipeline["order"] == trial["chosen"]
    assert set(trial["median_step_ms"]) == {"1f1b", "gpipe"}, trial
    pids, d, box, kill = kill_at_step_20(tmp_path, monkeypatch, 1)
    with pytest.raises(RankFailure) as info:
        run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), on_start=kill, **QUIET)
    assert "at" in box, "rank 1 was never killed"
    err = info.value  # named by its own death, not by a peer that timed out
    assert err.rank == 1 and err.signal == "SIGKILL" and err.stage == 1, str(err)
    assert "rank 1 (pipeline stage 1)" in str(err), str(err)
    time.sleep(0.5)
    assert not [p for p in pids.iterdir() if alive(int(p.read_text()))], "orphaned ranks"
    monkeypatch.delenv("DAGTRAIN_PID_DIR")
    resumed = run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), **QUIET)
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 20
    assert resumed.steps == whole.steps == 60
    assert resumed.pipeline["order_trial"]["chosen"] in ("1f1b", "gpipe")
    assert resumed.params_sha256 == whole.params_sha256  # bitwise
    assert [e["train_loss"] for e in resumed.epochs] == [e["train_loss"] for e in whole.epochs]


@pytest.mark.parametrize("backend", ["torch", "mpi"])
def test_an_elastic_pipeline_relaunches_its_stages_from_the_newest_checkpoint(
    tmp_path, backend, monkeypatch
):
    # 2 stages x 2 replicas, min_ranks 2: stage 1's second replica (rank 3) is killed
    # once the checkpoint of step 20 is whole; its slot is used again at once and the
    # stages resume from the newest sharded checkpoint (a survivor's state alone is
    # one stage's: no rescue), losing the steps since. Same stages and replicas: the
    # run ends bit for bit where the one nobody killed does.
    par = {"stages": 2, "microbatches": 2, "order": "1f1b", "split": [4]}
    cfg = dict(SLOW, backend=backend, ranks=4, parallel=par)
    whole = run_training(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a")), **QUIET)
    pids, d, box, kill = kill_at_step_20(tmp_path, monkeypatch, 3)
    worlds: list = []

    def first_world_only(job):
        worlds.append(job)
        if len(worlds) == 1:
            kill(job)

    lines: list[str] = []
    run = TrainConfig(
        **cfg,
        min_ranks=2,
        checkpoint_dir=str(d),
        status_dir=str(tmp_path / "ranks"),
        metrics_file=str(tmp_path / "metrics.jsonl"),
    )
    res = run_training(run, on_start=first_world_only, on_line=lines.append)
    assert "at" in box, "rank 3 was never killed"
    (change,) = res.world_changes
    assert (change["change"], change["from"], change["to"]) == ("restart", 4, 4), change
    assert change["ranks"] == [3], change
    # from a checkpoint (every 10 steps), the one of step 20 or a later one
    assert change["step"] % 10 == 0 and change["step"] >= 20, change
    assert change["steps_lost"] is not None and change["steps_lost"] <= 11, change
    assert any(x.startswith("dagtrain: world of 4 ranks relaunched at step") for x in lines)
    assert res.world == 4 and res.steps == whole.steps == 60
    assert res.params_sha256 == whole.params_sha256  # bitwise
    assert [e["train_loss"] for e in res.epochs] == [e["train_loss"] for e in whole.epochs]
    time.sleep(0.5)
    assert not [p for p in pids.iterdir() if alive(int(p.read_text()))], "orphaned ranks"


def test_a_pipeline_checkpoint_resumes_on_other_stages_and_chunks(tmp_path):
    # 20 steps on 4 stages, then on to 50 on 2 stages of 2 chunks each in a V: 4 other
    # parts, rank 0 holding parts 0 and 3 (epoch 0 ends at step 45: its evaluation goes
    # down the ranks and back, the loss on rank 0), against 50 steps in one process. The
    # 4 stages write their
    # checkpoints inline (from the live state, no copy), the 2 in the background
    cfg = dict(SLOW, model_args={"seconds": 0.0}, max_steps=50, backend="torch")
    one = run_training(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "one")), 1, **QUIET)
    d = str(tmp_path / "pp")
    two = {"stages": 4, "microbatches": 4, "order": "zero-bubble"}
    first = {**cfg, "max_steps": 20, "checkpoint_write": "inline"}
    r20 = run_training(TrainConfig(**first, ranks=4, parallel=two, checkpoint_dir=d), **QUIET)
    assert Path(r20.checkpoint).name == "ckpt-00000020.pt"  # the run names its newest
    # each stage wrote its own shard: no rank held the whole model
    assert sorted(p.name for p in Path(d).glob("ckpt-00000020*.pt")) == [
        "ckpt-00000020.pt",
        "ckpt-00000020.stage1.pt",
        "ckpt-00000020.stage2.pt",
        "ckpt-00000020.stage3.pt",
    ]
    # each with its tensors in a DCP folder of its own, which its sidecar lists (a stage
    # of blocks without parameters, such as ReLU and a pause, has none)
    folders = 0
    for s in range(4):
        part = Path(d) / ("ckpt-00000020.pt" if s == 0 else f"ckpt-00000020.stage{s}.pt")
        listed = json.loads(part.with_name(part.name + ".json").read_text())["tensors"]
        folder = Path(d) / f"ckpt-00000020.stage{s}.dcp"
        assert sorted(listed) == (sorted(p.name for p in folder.iterdir()) if listed else [])
        assert folder.exists() == bool(listed)
        folders += bool(listed)
    assert folders >= 2  # the first stage's Linear and the last's
    four = {"stages": 2, "chunks": 2, "microbatches": 2, "order": "gpipe", "placement": "v"}
    lines: list[str] = []
    r = run_training(
        TrainConfig(**cfg, ranks=2, parallel=four, checkpoint_dir=d), on_line=lines.append
    )
    assert r.resumed_from_step == 20 and r.steps == 50
    # the log says the checkpoint was resharded: written by 4 stages, read by 2
    said = [line for line in lines if "resumes from" in line]
    assert said and all(
        "(step 20; written by 4 pipeline stages, resharded onto 2 pipeline stages)" in line
        for line in said
    ), said
    assert one.steps == 50
    assert r.pipeline["parts"] == [0, 3] and len(r.pipeline["ranges"]) == 4
    # rank 0 holds its parts of the model, not the whole
    assert r.pipeline["held_parameters"] < r.pipeline["parameters"]
    a, b = final_params(tmp_path / "one"), final_params(Path(d))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6), k
    # the pipeline's evaluation gives the whole model's figures
    row, ref = r.epochs[0], one.epochs[0]
    assert row["test_samples"] == ref["test_samples"] > 0
    assert row["test_correct"] == ref["test_correct"], (row, ref)
    assert abs(row["test_loss"] - ref["test_loss"]) <= 1e-5 * abs(ref["test_loss"]), (row, ref)


@pytest.mark.alone  # a 5 s collective deadline
def test_a_stalled_stage_rank_fails_the_job_within_the_collective_timeout(tmp_path, monkeypatch):
    par = {"stages": 2, "microbatches": 4, "order": "1f1b", "split": [4]}
    cfg = dict(SLOW, backend="torch", ranks=2, parallel=par, collective_timeout=5, max_steps=400)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(pids))
    d = tmp_path / "b"
    box: dict = {}
    stop = signal_rank(d, pids, 1, signal.SIGSTOP, "ckpt-00000020.pt.json", box)
    try:
        with pytest.raises(RankFailure) as info:  # not TimeoutError: the 5 s deadline
            run_training(
                TrainConfig(**cfg, checkpoint_dir=str(d)), on_start=stop, timeout=120, **QUIET
            )
    finally:
        if "pid" in box and alive(box["pid"]):
            os.kill(box["pid"], signal.SIGCONT)
    assert "at" in box, "rank 1 was never stopped"
    msg = str(info.value)
    assert "rank 1 (stage 1)" in msg and "did not finish within 5 s" in msg, msg
    time.sleep(0.5)
    assert not [p for p in pids.iterdir() if alive(int(p.read_text()))], "orphaned ranks"


@pytest.mark.parametrize("placement", ["looped", "v"])
def test_a_short_last_batch_with_empty_microbatches_still_equals_one_process(tmp_path, placement):
    # 1437 training samples in batches of 64: the last has 29, 15 and 14 for the two
    # replicas, cut into 16 microbatches each (some of them empty); in a V, an empty
    # microbatch also goes through the last rank's turn
    base = dict(BASE, max_steps=None, batch_size=64, model_args={"hidden": [32, 32]})
    run_training(TrainConfig(**base, checkpoint_dir=str(tmp_path / "one")), 1, **QUIET)
    par = {"stages": 2, "microbatches": 16, "order": "zero-bubble"}
    if placement == "v":
        par |= {"chunks": 2, "placement": "v"}
    r = run_training(
        TrainConfig(
            **base, backend="torch", ranks=4, parallel=par, checkpoint_dir=str(tmp_path / "pp")
        ),
        **QUIET,
    )
    assert r.steps == 23
    a, b = final_params(tmp_path / "one"), final_params(tmp_path / "pp")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6), k


def test_non_finite_gradients_fail_naming_their_stage_or_skip_the_step_on_every_stage(tmp_path):
    # only stage 1's last block gets a NaN gradient (its weight's; the gradient sent back
    # to stage 0 is finite): under `fail` stage 1 names itself and that weight; under
    # `skip` stage 0, whose gradients are finite, skips the step too (one flag over all
    # ranks), so no parameter of either stage moves
    base = dict(
        BASE, model="tests.unit.training.factory:nan_last_weight", model_args={},
        backend="torch", ranks=2, parallel={"stages": 2, "microbatches": 2, "split": [2]},
    )  # fmt: skip
    with pytest.raises(RankFailure, match=r"step 0: non-finite gradients in stage 1 \(4\.w\)"):
        run_training(TrainConfig(**base, checkpoint_dir=str(tmp_path / "fail")), **QUIET)
    skip = TrainConfig(
        **{**base, "max_steps": 3}, nonfinite="skip", checkpoint_dir=str(tmp_path / "s")
    )
    r = run_training(skip, **QUIET)
    assert r.steps == 3 and r.skipped_steps == 3
    torch.manual_seed(skip.training.seed)
    first = nan_last_weight((8, 8), 10).state_dict()
    got = final_params(tmp_path / "s")
    assert set(got) == set(first) and any(k.startswith("1.") for k in got)  # stage 0's
    for k, v in got.items():
        assert torch.equal(v, first[k]), k
