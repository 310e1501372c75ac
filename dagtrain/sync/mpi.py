"""MPI through mpi4py: ``Iallreduce`` on zero-copy numpy views of the torch buffers.

Started under ``mpirun`` (``python -m mpi4py``, so that an uncaught exception on one
rank calls MPI_Abort instead of leaving the others blocked).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Backend, Handle, copy_back_and_divide, give_up

__all__ = ["MPIBackend"]


class MPIBackend(Backend):
    name = "mpi"

    def __init__(self, timeout: float = 60.0, device: str = "cpu", comm=None) -> None:
        super().__init__(timeout)
        self.device = device
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def allreduce_async(self, flat: torch.Tensor, what: str, average: bool = True) -> Handle:
        if not flat.is_contiguous():
            raise ValueError(f"{what}: MPI needs a contiguous tensor")
        # a GPU bucket goes through host memory: pip's Open MPI is not CUDA-aware
        host = flat if flat.device.type == "cpu" else flat.detach().to("cpu")
        view = host.numpy()  # shares memory with the tensor: no copy
        req = self.comm.Iallreduce(self._MPI.IN_PLACE, view, op=self._MPI.SUM)
        finish = copy_back_and_divide(flat, host, self.size if average else 1)
        # a blocking Wait lets MPI progress the collective at full speed (polling Test
        # with pauses starves it); the watchdog aborts the job if a peer never comes
        return Handle(what, block=req.Wait, finish=finish, on_timeout=self._abort)

    def _abort(self, err: Exception) -> None:
        give_up(err, self.comm.Abort)

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        # non-blocking broadcasts, all waited for under one watchdog: a peer that never
        # arrives (hung before its first collective) aborts the job after the timeout
        pairs = [
            (t, t.detach() if t.is_contiguous() and t.device.type == "cpu" else _host(t))
            for t in tensors
        ]
        reqs = [self.comm.Ibcast(buf.numpy(), root=root) for _, buf in pairs]
        waitall = self._MPI.Request.Waitall
        Handle("broadcast", block=lambda: waitall(reqs), on_timeout=self._abort).wait(
            self.rank, self.timeout
        )
        for t, buf in pairs:
            if buf.data_ptr() != t.data_ptr():
                t.data.copy_(buf)

    def send_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        req = self.comm.Isend(_view(t, what), dest=peer, tag=tag)
        return Handle(what, block=req.Wait, on_timeout=self._abort)

    def recv_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        req = self.comm.Irecv(_view(t, what), source=peer, tag=tag)
        return Handle(what, block=req.Wait, on_timeout=self._abort)

    def subgroups(self, groups: Sequence[Sequence[int]]) -> Backend:
        color = next((i for i, g in enumerate(groups) if self.rank in g), None)
        if color is None:
            raise ValueError(f"rank {self.rank} is in none of the groups {groups}")
        sub = self.comm.Split(color, key=list(groups[color]).index(self.rank))
        return MPIBackend(self.timeout, self.device, comm=sub)

    def barrier(self) -> None:
        req = self.comm.Ibarrier()
        Handle("barrier", block=req.Wait, on_timeout=self._abort).wait(self.rank, self.timeout)


def _view(t: torch.Tensor, what: str):
    """A numpy view of ``t``'s memory, for MPI to read or write in place."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"{what}: MPI transfers need a contiguous tensor in host memory")
    return t.detach().numpy()


def _host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in host memory, for MPI to read and write."""
    return t.detach().to("cpu", copy=True).contiguous()
