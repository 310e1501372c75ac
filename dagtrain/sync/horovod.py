"""Horovod: ``allreduce_async_`` (in place, averaged or summed) on each bucket. Started under
``mpirun`` (MPI controller) or ``horovodrun --gloo``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Backend, Handle

__all__ = ["HorovodBackend"]


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, timeout: float = 60.0, device: str = "cpu") -> None:
        super().__init__(timeout)
        # CUDA tensors are reduced by Horovod itself (NCCL) when it was built with
        # HOROVOD_GPU_OPERATIONS=NCCL; the CPU build refuses them
        self.device = device
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self._n = 0

    def allreduce_async(self, flat: torch.Tensor, what: str, average: bool = True) -> Handle:
        hvd = self.hvd
        handle = hvd.allreduce_async_(flat, name=what, op=hvd.Average if average else hvd.Sum)
        return Handle(what, block=lambda: hvd.synchronize(handle))

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        hvd = self.hvd
        handles = []
        for t in tensors:
            self._n += 1
            handles.append(hvd.broadcast_async_(t.data, root_rank=root, name=f"bcast.{self._n}"))
        for h in handles:
            Handle("broadcast", lambda h=h: hvd.poll(h), lambda h=h: hvd.synchronize(h)).wait(
                self.rank, self.timeout
            )

    def barrier(self) -> None:
        self.hvd.barrier()

    def close(self, failed: bool = False) -> None:
        self.hvd.shutdown()
