"""torch.distributed: gloo on CPU, nccl on GPU. Ranks come from the environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), as torchrun sets it.

On a GPU (``device="cuda:N"``) the process group is NCCL's, bound to that device; the
few CPU tensors the trainer reduces (an epoch's metric sums, the checkpoint's) and
broadcasts (a resumed run's checkpoint path) are copied to the GPU and back, as NCCL
reduces device memory only."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .base import Backend, Handle, copy_back_and_divide

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    name = "torch"

    def __init__(
        self, timeout: float = 60.0, device: str = "cpu", group: dist.ProcessGroup | None = None
    ) -> None:
        super().__init__(timeout)
        self.device = device
        self.group = group  # a subgroup's (None: the world)
        cuda = device.startswith("cuda")
        if group is not None:
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)
            return
        if not dist.is_initialized():
            extra = {}
            if cuda:  # NCCL binds the process group to this rank's one GPU
                torch.cuda.set_device(torch.device(device))
                extra["device_id"] = torch.device(device)
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                init_method="env://",
                timeout=datetime.timedelta(seconds=timeout),
                **extra,
            )
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` where the process group reduces: itself, or its copy on the GPU."""
        if self.device.startswith("cuda") and t.device.type != "cuda":
            return t.to(self.device)
        return t

    def allreduce_async(self, flat: torch.Tensor, what: str, average: bool = True) -> Handle:
        buf = self._staged(flat)
        work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        finish = copy_back_and_divide(flat, buf, self.size if average else 1)
        # gloo progresses in its own thread; its wait takes the process group's timeout
        return Handle(what, block=work.wait, finish=finish)

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        for t in tensors:
            buf = self._staged(t)
            dist.broadcast(buf, group=self.group, group_src=root)
            if buf is not t:
                t.copy_(buf)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def send_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        work = dist.isend(t, dst=peer, tag=tag)
        return Handle(what, block=work.wait)

    def recv_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        work = dist.irecv(t, src=peer, tag=tag)
        return Handle(what, block=work.wait)

    def subgroups(self, groups: Sequence[Sequence[int]]) -> Backend:
        mine = None
        for g in groups:  # every rank creates every group, in the same order
            pg = dist.new_group(list(g), timeout=datetime.timedelta(seconds=self.timeout))
            if self.rank in g:
                mine = pg
        if mine is None:
            raise ValueError(f"rank {self.rank} is in none of the groups {groups}")
        return TorchBackend(self.timeout, self.device, group=mine)

    def close(self, failed: bool = False) -> None:
        if self.group is not None:  # a subgroup: the world's close ends it
            return
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
