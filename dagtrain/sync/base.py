"""The gradient-sync interface every backend implements.

A backend is a process group of ``size`` ranks. The training step uses four things:
broadcast tensors from rank 0 (parameters and optimizer state at start), an
asynchronous in-place *average* of a flat bucket (or its sum, ``average=False``: the
step divides it itself, in the pass that checks it is finite), waiting for it with a
timeout, and a barrier. Every wait has a deadline: a rank that died makes the others raise
:class:`CollectiveTimeout` naming the bucket, instead of hanging.

Collectives are issued in the same order on every rank (the step graph chains the
allreduce tasks in bucket order); backends that match collectives by order (gloo,
MPI) rely on it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "GAVE_UP",
    "Backend",
    "CollectiveFailed",
    "CollectiveTimeout",
    "Handle",
    "copy_back_and_divide",
    "give_up",
    "wait_until",
]

# the exit code of a rank that gave up on a blocked collective (os.EX_SOFTWARE): it
# cannot be interrupted, so the process ends; the launcher reads the rank's status record
GAVE_UP = 70


def _whose(what: str, rank: int) -> str:
    """``rank N: `` before ``what``, unless it names its rank first (a pipeline's
    ``rank 0 (stage 0): receiving ...``)."""
    return "" if what.startswith(f"rank {rank} ") else f"rank {rank}: "


class CollectiveTimeout(TimeoutError):
    """A collective did not finish in time (a peer rank probably died)."""

    def __init__(self, what: str, rank: int, timeout: float) -> None:
        super().__init__(
            f"{_whose(what, rank)}{what} did not finish within {timeout:g} s; a peer rank has "
            "probably failed (its log says why) or the network is stuck"
        )
        self.what = what
        self.rank = rank
        self.timeout = timeout


class CollectiveFailed(RuntimeError):
    """A collective failed before its deadline (a peer's connection closed or reset): the
    library's error is the ``__cause__`` and its text is in the message."""

    def __init__(self, what: str, rank: int, cause: BaseException) -> None:
        said = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        super().__init__(
            f"{_whose(what, rank)}{what} failed: {type(cause).__name__}: {said}; a peer rank has "
            "probably failed (its log says why)"
        )
        self.what = what
        self.rank = rank
        self.__cause__ = cause


class Handle:
    """An in-flight collective: ``wait(rank, timeout)`` blocks until it is done, or raises.

    Either ``test`` (polled, for libraries without a blocking wait that has a timeout)
    or ``block`` (a blocking wait, run under a watchdog: on timeout the watchdog calls
    ``on_timeout``, which must end the wait, typically by aborting the job).
    """

    def __init__(
        self,
        what: str,
        test: Callable[[], bool] | None = None,
        finish: Callable[[], None] = lambda: None,
        block: Callable[[], None] | None = None,
        on_timeout: Callable[[CollectiveTimeout], None] | None = None,
    ) -> None:
        self.what = what
        self._test = test
        self._finish = finish
        self._block = block
        self._on_timeout = on_timeout

    def wait(self, rank: int, timeout: float) -> None:
        if self._block is None:
            wait_until(self._test or (lambda: True), self.what, rank, timeout)
        else:
            err = CollectiveTimeout(self.what, rank, timeout)
            key = _WATCHDOG.arm(timeout, self._on_timeout or give_up, err)
            try:
                self._block()
            finally:
                _WATCHDOG.disarm(key)
        self._finish()


class _Watchdog:
    """One daemon thread watches every blocking wait of the process: ``arm`` before the
    wait, ``disarm`` after it; a wait still armed at its deadline gets its ``on_timeout``
    called from this thread (which must end the wait). A ``threading.Timer`` per wait
    cost ~0.16 ms of thread start and stop per collective on 2 shared cores, six times a
    step for the 21M MLP; arming here is a dict entry. Deadlines are checked every
    ``PERIOD`` seconds, so a timeout fires up to that much late."""

    PERIOD = 0.1

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, Callable[[CollectiveTimeout], None], Any]] = {}
        self._count = 0
        self._thread: threading.Thread | None = None

    def arm(self, timeout: float, on_timeout: Callable[[Any], None], err: Any) -> int:
        with self._lock:
            self._count += 1
            key = self._count
            self._armed[key] = (time.monotonic() + timeout, on_timeout, err)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="dagtrain-watchdog", daemon=True
                )
                self._thread.start()
        return key

    def disarm(self, key: int) -> None:
        with self._lock:
            self._armed.pop(key, None)

    def _watch(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            now = time.monotonic()
            with self._lock:
                due = [k for k, (deadline, _, _) in self._armed.items() if deadline <= now]
                fire = [self._armed.pop(k) for k in due]
            for _, on_timeout, err in fire:
                try:
                    on_timeout(err)
                except BaseException:  # one failing callback spares the others
                    import traceback

                    traceback.print_exc()


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):  # a forked child has no watchdog thread (nor lock)
    os.register_at_fork(after_in_child=_WATCHDOG._reset)


def copy_back_and_divide(
    flat: torch.Tensor, staged: torch.Tensor, divisor: int
) -> Callable[[], None]:
    """A Handle's ``finish`` for a backend that reduces ``staged`` (``flat`` itself, or a
    copy of it in memory the library can use) by summing: the sum back into ``flat``,
    divided by ``divisor`` (the world size for an average, 1 for a sum)."""

    def finish() -> None:
        if staged is not flat:
            flat.copy_(staged)
        if divisor > 1:
            flat.div_(divisor)

    return finish


def give_up(err: BaseException, end: Callable[[int], Any] | None = None) -> None:
    """End a rank whose collective passed its deadline: its status record says why (the
    launcher reads it), its log too, an elastic rank saves its last completed step, then
    ``end(GAVE_UP)`` (``os._exit`` unless the library has its own abort)."""
    import sys

    from dagtrain.rank_env import report_failure, stopping

    rank = getattr(err, "rank", "?")
    report_failure(str(rank), err)
    print(f"dagtrain rank {rank} failed: {err}", file=sys.stderr, flush=True)
    stopping(str(err))
    (end or os._exit)(GAVE_UP)


def wait_until(test: Callable[[], bool], what: str, rank: int, timeout: float) -> None:
    """Poll ``test`` (which must release the GIL or be cheap) until true or timeout."""
    deadline = time.monotonic() + timeout
    pause = 1e-5
    while not test():
        if time.monotonic() > deadline:
            raise CollectiveTimeout(what, rank, timeout)
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class Backend:
    """Base class; see the module docstring. ``timeout`` bounds every collective."""

    name = "base"

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.rank = 0
        self.size = 1
        # where this rank's model lives ("cpu" or "cuda:N"); a backend given tensors
        # elsewhere stages them (torch: CPU tensors to the GPU for NCCL; mpi4py: GPU
        # buckets through host memory)
        self.device = "cpu"

    # -- to implement
    def allreduce_async(self, flat: torch.Tensor, what: str, average: bool = True) -> Handle:
        """Start averaging ``flat`` in place over all ranks (summing, ``average=False``)."""
        raise NotImplementedError

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        """Leave the process group (idempotent). ``failed``: this rank is leaving on an
        error, so it must not wait for its peers on the way out."""

    # -- point to point and subgroups (a pipeline's stages; torch and mpi only)
    def send_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        """Start sending ``t`` (contiguous, kept alive until done) to rank ``peer``; a
        receive with the same ``tag`` matches it, whatever the order they were posted in."""
        raise NotImplementedError(f"backend {self.name} has no point-to-point transfers")

    def recv_async(self, t: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        """Start receiving into ``t`` from rank ``peer`` (the send with ``tag``)."""
        raise NotImplementedError(f"backend {self.name} has no point-to-point transfers")

    def subgroups(self, groups: Sequence[Sequence[int]]) -> Backend:
        """The process group of the one of ``groups`` (disjoint lists of ranks, the same
        on every rank, which all call this together) that holds this rank; its
        collectives involve those ranks only, its ``rank`` is the index in the list."""
        raise NotImplementedError(f"backend {self.name} has no subgroups")

    # -- derived
    def allreduce(self, flat: torch.Tensor, what: str, average: bool = True) -> None:
        self.allreduce_async(flat, what, average).wait(self.rank, self.timeout)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Broadcast a small JSON-able object from ``root``."""
        import json

        import torch

        data = json.dumps(obj).encode() if self.rank == root else b""
        n = torch.tensor([len(data)], dtype=torch.int64)
        self.broadcast([n], root)
        buf = torch.zeros(int(n.item()), dtype=torch.uint8)
        if self.rank == root:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast([buf], root)
        return json.loads(buf.numpy().tobytes().decode())

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"
