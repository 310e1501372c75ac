"""Which device a rank trains on: the CPU, or one GPU per rank.

``distributed.device``:

- ``cpu`` (the default): every rank on the CPU; gloo for torch.distributed.
- ``cuda``: one GPU per rank. A rank's GPU is its *local* rank's (its index among the
  ranks on its host: ``LOCAL_RANK`` from torchrun and the direct launcher,
  ``OMPI_COMM_WORLD_LOCAL_RANK`` from mpirun, ``HOROVOD_LOCAL_RANK`` from horovodrun),
  and the rank sees that GPU alone: ``CUDA_VISIBLE_DEVICES`` is narrowed to it before
  anything initialises CUDA, so the device is always ``cuda:0`` and no rank can touch
  another's memory. A host's GPUs are those ``CUDA_VISIBLE_DEVICES`` lists when it is
  set (a scheduler's share of the machine), else all of them. torch.distributed then
  uses NCCL; mpi4py stages each bucket through host memory (the pip Open MPI is not
  CUDA-aware); Horovod reduces CUDA tensors itself when it was built with
  ``HOROVOD_GPU_OPERATIONS=NCCL``.
- ``auto``: ``cuda`` where this host has a GPU for the rank, else ``cpu``.

A host needs as many GPUs as it runs ranks: give it that many slots in the host list.

.. warning:: The CUDA path is written and unit-tested with CUDA mocked; it has not run
   on a GPU yet.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from dagtrain.errors import InputError

if TYPE_CHECKING:
    import torch

__all__ = ["LOCAL_RANK_VARIABLES", "choose_device", "local_rank"]

# torchrun and the direct launcher, mpirun (Open MPI), horovodrun, Intel MPI, Slurm
LOCAL_RANK_VARIABLES = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "HOROVOD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
)
# set once this process has narrowed CUDA_VISIBLE_DEVICES to its GPU (so that a second
# call does not narrow it again, relative to the narrowed list)
_PINNED = "DAGTRAIN_PINNED_GPU"


def local_rank() -> int:
    """This process's index among the ranks on its host, as its launcher said (0 when
    none did: a single process)."""
    for var in LOCAL_RANK_VARIABLES:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def _visible() -> list[str] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [d.strip() for d in value.split(",") if d.strip()]


def choose_device(requested: str = "cpu") -> torch.device:
    """The device of this rank for ``distributed.device`` = ``requested``.

    For ``cuda`` (and ``auto``), call it before anything asks torch about CUDA: it sets
    ``CUDA_VISIBLE_DEVICES`` to this rank's GPU alone, then checks that it is there.
    Raises InputError naming ``distributed.device`` when ``cuda`` is asked for and the
    rank has no GPU.
    """
    import torch

    if requested == "cpu":
        return torch.device("cpu")
    if requested not in ("cuda", "auto"):
        raise InputError(f"distributed.device: {requested!r} is not one of cpu, cuda, auto")
    host = socket.gethostname()
    lr = local_rank()
    if os.environ.get(_PINNED) is None:
        gpus = _visible()
        if gpus is not None and lr >= len(gpus):
            if requested == "auto":
                return torch.device("cpu")
            raise InputError(
                f"distributed.device is cuda but local rank {lr} on host {host} has no GPU: "
                f"CUDA_VISIBLE_DEVICES lists {len(gpus)} ({','.join(gpus) or 'none'}); give "
                "this host as many slots as GPUs in the host list, or fewer ranks"
            )
        # before CUDA initialises: this rank sees its own GPU only, as cuda:0
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[lr] if gpus is not None else str(lr)
        os.environ[_PINNED] = os.environ["CUDA_VISIBLE_DEVICES"]
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        if requested == "auto":
            return torch.device("cpu")
        raise InputError(
            f"distributed.device is cuda but local rank {lr} on host {host} sees no CUDA "
            f"device (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}; a CPU "
            "build of torch, no driver, or fewer GPUs than ranks on this host): set "
            "distributed.device cpu or auto, or give the host fewer slots"
        )
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)
