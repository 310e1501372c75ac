"""torch.distributed: gloo on CPU, nccl on GPU. Ranks come from the environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), as torchrun sets it."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .base import Backend, Handle

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, timeout: float = 60.0, device: str = "cpu") -> None:
        super().__init__(timeout)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout)
            )
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def allreduce_async(self, flat: torch.Tensor, what: str) -> Handle:
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        size = self.size
        # gloo progresses in its own thread; its wait takes the process group's timeout
        return Handle(what, block=work.wait, finish=lambda: flat.div_(size))

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        for t in tensors:
            dist.broadcast(t, src=root)

    def barrier(self) -> None:
        dist.barrier()

    def close(self, failed: bool = False) -> None:
        if dist.is_initialized():
            # leave together: a rank that tears gloo down while its peer still talks to
            # it (rank 0 also hosts the rendezvous store) dies in a C++ destructor with
            # "terminate called without an active exception" (SIGABRT). A failing rank
            # does not wait: its peers may be the reason it fails.
            try:
                if not failed:
                    dist.barrier()
            finally:
                dist.destroy_process_group()
