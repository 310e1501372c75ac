"""The CUDA path with CUDA mocked (no GPU here): which GPU a rank takes, what it sees,
what it refuses, and that the process group is NCCL's on a GPU. ``auto`` on this
machine trains on the CPU, exactly as ``cpu`` does."""

from __future__ import annotations

import pytest
import torch

from dagtrain.errors import InputError
from dagtrain.training.rank import device as dev
from dagtrain.training.rank.device import LOCAL_RANK_VARIABLES, choose_device, local_rank


@pytest.fixture
def env(monkeypatch):
    for var in (*LOCAL_RANK_VARIABLES, "CUDA_VISIBLE_DEVICES", dev._PINNED):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def gpus(env):
    """torch.cuda as a host with GPUs would answer; what set_device was given."""
    calls: list[int] = []
    env.setattr(torch.cuda, "is_available", lambda: True)
    env.setattr(torch.cuda, "device_count", lambda: 1)  # the rank sees its one GPU
    env.setattr(torch.cuda, "set_device", calls.append)
    return calls


@pytest.mark.parametrize("var", LOCAL_RANK_VARIABLES)
def test_the_local_rank_comes_from_any_launchers_variable(env, var):
    assert local_rank() == 0
    env.setenv(var, "3")
    assert local_rank() == 3


def test_cpu_leaves_cuda_alone(env):
    assert choose_device("cpu") == torch.device("cpu")
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize(
    ("visible", "var", "lr", "gpu"),
    [
        (None, "LOCAL_RANK", "2", "2"),  # torchrun, the direct launcher: GPU 2 of all
        ("4,5,6,7", "OMPI_COMM_WORLD_LOCAL_RANK", "1", "5"),  # mpirun in a share of 4
        ("GPU-a1, GPU-b2", "HOROVOD_LOCAL_RANK", "1", "GPU-b2"),  # UUIDs, spaces
    ],
)
def test_a_cuda_rank_sees_its_local_ranks_gpu_alone_as_cuda_0(gpus, env, visible, var, lr, gpu):
    import os

    if visible is not None:
        env.setenv("CUDA_VISIBLE_DEVICES", visible)
    env.setenv(var, lr)
    assert choose_device("cuda") == torch.device("cuda", 0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == gpu
    assert gpus == [0]
    # asked again (a second call in the same rank), it does not narrow the list again
    assert choose_device("auto") == torch.device("cuda", 0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == gpu


def test_more_ranks_on_a_host_than_its_gpus_are_refused_by_field(gpus, env):
    env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env.setenv("LOCAL_RANK", "2")
    with pytest.raises(InputError) as info:
        choose_device("cuda")
    msg = str(info.value)
    assert "distributed.device is cuda but local rank 2" in msg and "lists 2 (0,1)" in msg
    assert "as many slots as GPUs" in msg
    assert choose_device("auto") == torch.device("cpu")  # auto: the CPU instead


def test_no_cuda_at_all_is_refused_for_cuda_and_falls_back_for_auto(env):
    env.setattr(torch.cuda, "is_available", lambda: False)
    env.setenv("LOCAL_RANK", "0")
    with pytest.raises(InputError, match=r"distributed\.device is cuda but local rank 0 on host"):
        choose_device("cuda")
    env.delenv(dev._PINNED)
    assert choose_device("auto") == torch.device("cpu")
    with pytest.raises(InputError, match="not one of cpu, cuda, auto"):
        choose_device("tpu")


def test_torch_on_a_gpu_uses_nccl_bound_to_the_ranks_device(env):
    import torch.distributed as dist

    from dagtrain.sync import get_backend

    seen = {}
    env.setattr(dist, "is_initialized", lambda: False)
    env.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend))
    env.setattr(dist, "get_rank", lambda: 1)
    env.setattr(dist, "get_world_size", lambda: 2)
    env.setattr(torch.cuda, "set_device", lambda d: seen.update(set_device=d))
    b = get_backend("torch", 30.0, device="cuda:0")
    assert seen["backend"] == "nccl" and seen["device_id"] == torch.device("cuda", 0)
    assert seen["set_device"] == torch.device("cuda", 0)
    assert (b.rank, b.size, b.device) == (1, 2, "cuda:0")
    seen.clear()
    get_backend("torch", 30.0)
    assert seen["backend"] == "gloo" and "device_id" not in seen


def test_every_backend_knows_its_ranks_device():
    from dagtrain.sync import get_backend

    assert get_backend("local", 5.0).device == "cpu"
    assert get_backend("local", 5.0, device="cuda:0").device == "cuda:0"


def test_auto_on_a_machine_without_gpus_trains_exactly_as_cpu():
    from dagtrain.training import TrainConfig, run_training

    base = dict(backend="mpi", epochs=1, max_steps=4, batch_size=32, model_args={"hidden": [16]})
    quiet = {"on_line": lambda line: None}
    cpu = run_training(TrainConfig(**base, device="cpu"), 2, **quiet)
    auto = run_training(TrainConfig(**base, device="auto"), 2, **quiet)
    assert auto.config["distributed"]["device"] == "auto"
    assert auto.params_sha256 == cpu.params_sha256
