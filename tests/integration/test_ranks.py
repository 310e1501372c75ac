"""Real ranks in real processes: torch.distributed (gloo), mpi4py under mpirun, Horovod
under mpirun. Nothing here is mocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from dagtrain.errors import InputError
from dagtrain.launch import RankFailure, RankInputError
from dagtrain.training import TrainConfig, run_training
from dagtrain.training.rank import checkpoint as ckpt

from .faults import alive, signal_rank

QUIET = {"on_line": lambda line: None}


def small(**kw) -> TrainConfig:
    base = {
        "epochs": 1,
        "max_steps": 6,
        "batch_size": 32,
        "bucket_mb": 0.01,
        "model_args": {"hidden": [32]},
        "collective_timeout": 30,
    }
    return TrainConfig(**{**base, **kw})


def final_params(directory: Path) -> dict[str, torch.Tensor]:
    _, state = ckpt.latest(directory)
    return state["model"]


def test_two_ranks_on_every_backend_agree_with_one_process_on_the_union_batch(tmp_path):
    # the defining property of data parallelism: 2 ranks x 16 samples == 1 x 32
    single = run_training(small(checkpoint_dir=str(tmp_path / "local")), 1, **QUIET)
    reference = final_params(tmp_path / "local")
    digests = {}
    for backend in ("torch", "mpi", "horovod"):
        d = tmp_path / backend
        r = run_training(small(backend=backend, checkpoint_dir=str(d)), 2, **QUIET)
        assert (r.world, r.backend, r.steps) == (2, backend, 6)
        digests[backend] = r.params_sha256
        got = final_params(d)
        for k, v in reference.items():
            assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), (backend, k)
    assert single.world == 1
    # the three backends sum two numbers the same way: bitwise equal among themselves
    assert len(set(digests.values())) == 1, digests


def test_overlap_on_and_off_agree_across_ranks():
    on = run_training(small(backend="mpi", overlap=True), 2, **QUIET)
    off = run_training(small(backend="mpi", overlap=False), 2, **QUIET)
    assert on.params_sha256 == off.params_sha256


def test_digits_on_two_ranks_reaches_95_percent():
    r = run_training(TrainConfig(backend="mpi", epochs=3), 2, **QUIET)
    assert r.test_accuracy >= 0.95, r.epochs


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_a_killed_rank_fails_fast_and_the_resumed_run_is_bitwise_exact(
    tmp_path, backend, monkeypatch
):
    cfg = dict(
        backend=backend,
        model="tests.unit.training.factory:slow",
        model_args={"seconds": 0.01},
        epochs=3,
        max_steps=120,
        checkpoint_every=10,
        batch_size=32,
    )
    whole = run_training(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a")), 2, **QUIET)

    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(pids))
    d = tmp_path / "b"
    killed: dict = {}
    killer = signal_rank(d, pids, 1, signal.SIGKILL, "ckpt-00000020.pt.json", killed)

    with pytest.raises(RankFailure) as info:
        run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), 2, on_start=killer, **QUIET)
    assert "at" in killed, "rank 1 was never killed"
    err = info.value
    # named by its own death (the launcher saw it exit), not by a peer that timed out
    assert err.rank == 1 and err.signal == "SIGKILL", str(err)
    # its own last lines, not the launcher's banner
    assert any("dagtrain rank 1 reached its first collective" in x for x in err.log_tail), err
    time.sleep(0.5)
    survivors = [p for p in pids.iterdir() if alive(int(p.read_text()))]
    assert not survivors, "orphaned ranks"

    monkeypatch.delenv("DAGTRAIN_PID_DIR")
    resumed = run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), 2, **QUIET)
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 20
    assert resumed.steps == whole.steps == 120
    assert resumed.params_sha256 == whole.params_sha256  # bitwise
    assert [e["train_loss"] for e in resumed.epochs] == pytest.approx(
        [e["train_loss"] for e in whole.epochs]
    )


@pytest.mark.parametrize(
    ("backend", "launcher"),
    [("mpi", "mpirun"), ("torch", "direct"), ("torch", "torchrun"), ("horovod", "horovodrun")],
)
def test_a_rank_that_raises_is_named_with_its_log(backend, launcher):
    bad = small(
        backend=backend,
        model="tests.unit.training.factory:fail_on_rank1",
        model_args={},
        collective_timeout=20,
    )
    with pytest.raises(RankFailure) as info:
        run_training(bad, 2, launcher=launcher, timeout=60, **QUIET)
    err = info.value
    assert err.rank == 1, str(err)
    assert any("rank 1 cannot build its model" in line for line in err.log_tail), err.log_tail


@pytest.mark.parametrize(
    ("backend", "launcher"), [("mpi", "mpirun"), ("torch", "direct"), ("torch", "torchrun")]
)
def test_a_rank_that_refuses_its_input_says_so_as_data_and_is_an_input_error(backend, launcher):
    bad = small(backend=backend, model_args={"hiddn": [8]})
    with pytest.raises(RankInputError) as info:
        run_training(bad, 2, launcher=launcher, timeout=60, **QUIET)
    err = info.value
    assert isinstance(err, InputError) and isinstance(err, RankFailure)
    assert err.rank in (0, 1) and err.error.startswith("InputError: model.args {'hiddn': [8]}")
    assert str(err).startswith(f"rank {err.rank} refused its input: InputError: model.args")
    assert "not retried" in str(err)


def test_a_rank_that_fails_otherwise_is_not_an_input_error(tmp_path):
    bad = small(
        backend="mpi",
        model="tests.unit.training.factory:fail_once",
        model_args={"marker": str(tmp_path / "m"), "at_call": 2},
    )
    with pytest.raises(RankFailure) as info:
        run_training(bad, 2, timeout=60, **QUIET)
    err = info.value
    assert not isinstance(err, InputError), err
    assert err.rank == 1 and err.error.endswith("RuntimeError: injected fault: rank 1 fails once")
    assert err.summary == str(err).split(";")[0], err.summary


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_killing_the_launcher_leaves_no_rank_behind(tmp_path, backend):
    pids = tmp_path / "pids"
    pids.mkdir()
    code = (
        "from dagtrain.training import run_training\n"
        "from dagtrain.training import TrainConfig\n"
        f"run_training(TrainConfig(backend={backend!r}, epochs=50, "
        "model='tests.unit.training.factory:slow'), 2, on_line=lambda line: None)\n"
    )
    env = {**os.environ, "DAGTRAIN_PID_DIR": str(pids)}
    launcher = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pids.iterdir()]
    assert len(ranks) == 2 and all(alive(p) for p in ranks)
    family = psutil.Process(launcher.pid).children(recursive=True)  # mpirun/torchrun too
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=20)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if alive(p)], "orphaned ranks"
    _, left = psutil.wait_procs(family, timeout=30)
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_previous_one_resumed(tmp_path):
    cfg = small(backend="mpi", max_steps=6, checkpoint_every=2)
    whole = run_training(cfg.model_copy(update={"checkpoint_dir": str(tmp_path / "a")}), 2, **QUIET)
    d = tmp_path / "b"
    run_training(cfg.model_copy(update={"checkpoint_dir": str(d)}), 2, **QUIET)
    newest = d / "ckpt-00000006.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    lines: list[str] = []
    again = run_training(cfg.model_copy(update={"checkpoint_dir": str(d)}), 2, on_line=lines.append)
    assert again.resumed_from_step == 4
    assert any("skipping checkpoint" in line and "ckpt-00000006.pt" in line for line in lines)
    assert again.params_sha256 == whole.params_sha256


@pytest.mark.alone  # a 3 s collective deadline: a busy machine would trip it elsewhere
@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_a_rank_that_hangs_makes_the_others_time_out_instead_of_waiting(backend):
    cfg = small(
        backend=backend,
        model="tests.unit.training.factory:hang_on_rank1",
        model_args={},
        collective_timeout=3,
        max_steps=10,
    )
    with pytest.raises(RankFailure) as info:  # not TimeoutError: the collective's deadline
        run_training(cfg, 2, timeout=120, **QUIET)
    assert info.value.rank == 0, str(info.value)  # rank 0 noticed the silent peer
    text = str(info.value) + "\n".join(info.value.log_tail)
    assert "3 s" in text or "imeout" in text or "timed out" in text, text


def test_a_host_list_on_one_machine():
    r = run_training(small(backend="mpi"), 2, hosts=["localhost:2"], **QUIET)
    assert r.world == 2 and r.steps == 6


@pytest.mark.alone  # a 5 s collective deadline
@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_a_rank_hung_before_its_first_collective_is_named_and_nothing_hangs(tmp_path, backend):
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = small(
        backend=backend,
        model="tests.unit.training.factory:hang_before_first_collective",
        model_args={},
        collective_timeout=5,
    )
    with pytest.raises(RankFailure) as info:  # not TimeoutError: the collective's deadline
        old = os.environ.get("DAGTRAIN_PID_DIR")
        os.environ["DAGTRAIN_PID_DIR"] = str(pids)
        try:
            run_training(cfg, 2, timeout=120, **QUIET)
        finally:
            os.environ.pop("DAGTRAIN_PID_DIR")
            if old is not None:
                os.environ["DAGTRAIN_PID_DIR"] = old
    err = info.value
    assert err.rank == 1 and "never reached its first collective" in str(err), str(err)
    assert "rank 0 gave up waiting" in str(err), str(err)
    time.sleep(0.5)
    assert not [p for p in pids.iterdir() if alive(int(p.read_text()))], "ranks left"


@pytest.mark.parametrize(
    ("backend", "launcher"), [("mpi", "mpirun"), ("torch", "direct"), ("torch", "torchrun")]
)
def test_sigkill_of_the_launching_process_leaves_no_rank_behind(
    tmp_path, short_tmp, backend, launcher
):
    pids = tmp_path / "pids"
    pids.mkdir()
    code = (
        "from dagtrain.training import TrainConfig, run_training\n"
        f"run_training(TrainConfig(backend={backend!r}, epochs=50, "
        "model='tests.unit.training.factory:slow'), 2, "
        f"launcher={launcher!r}, on_line=lambda line: None)\n"
    )
    # (a SIGKILLed launcher cannot remove its temporary folders: they go where the test
    # removes them)
    env = {**os.environ, "DAGTRAIN_PID_DIR": str(pids), "TMPDIR": str(short_tmp)}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pids.iterdir()]
    assert len(ranks) == 2 and all(alive(p) for p in ranks)
    # mpirun or torchrun too (a torchrun stopped by SIGTERM once hung at its exit for ever)
    family = psutil.Process(parent.pid).children(recursive=True)
    parent.send_signal(signal.SIGKILL)  # no handler runs: only the kernel can help
    parent.wait(timeout=20)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if alive(p)], "ranks outlived a SIGKILLed launcher"
    _, left = psutil.wait_procs(family, timeout=30)
    assert not left, [" ".join(p.cmdline()) for p in left if p.is_running()]
