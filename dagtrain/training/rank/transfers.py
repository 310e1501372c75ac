"""The transfers of one direction of a pipeline stage (and one chunk), awaited in order.

A stage's send and receive tasks are detached: their body posts the transfer and
returns, and a :class:`Transfers` per direction (and chunk) waits for each transfer (with
the backend's deadline) in the order they were posted, then completes its task, or
fails it with a :class:`~dagtrain.sync.CollectiveTimeout` naming the transfer (or a
:class:`~dagtrain.sync.CollectiveFailed` carrying the library's error, such as a peer's
connection reset, as its cause). Transfers
of one direction between two ranks complete in the order they were posted (a channel's
messages do not overtake each other), so waiting in order delays none.

Who waits: a thread of its own, or (``thread=False``) the stage's thread, when it has
nothing else to start (:meth:`Transfers.wait_next`, the step graph's ``idle``). The
stage's thread then wakes once, when the transfer completes, where the waiting thread
would wake first and then wake it: one thread hand-over less on each hop of the
pipeline's critical path. That is right only where the oldest transfer of this one
direction comes before anything else the stage could start (see
:class:`~.pipelining.StageStep`).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any

from dagtrain.launch.diagnose import TIMED_OUT
from dagtrain.sync import CollectiveFailed, CollectiveTimeout, Handle
from dagtrain.taskgraph import Event

__all__ = ["Transfers"]


class Transfers:
    """The transfers of one direction, waited for in the order they were posted, each
    one's detached task completed (or failed): by a thread of its own, or
    (``thread=False``) by whoever calls :meth:`wait_next`."""

    def __init__(self, name: str, rank: int, timeout: float, thread: bool = True) -> None:
        self.rank, self.timeout = rank, timeout
        self.q: Any = queue.SimpleQueue() if thread else deque()
        self.thread: threading.Thread | None = None
        if thread:
            self.thread = threading.Thread(target=self._wait, name=name, daemon=True)
            self.thread.start()

    def post(self, handle: Handle, event: Event | None, keep: Any) -> None:
        """Wait for ``handle`` after those posted before it; ``keep`` (the tensor it
        reads or writes) stays alive until then. ``event`` None (``thread=False``): no
        task waits for it, :meth:`drain` does."""
        if self.thread is not None:
            self.q.put((handle, event, keep))
        else:
            self.q.append((handle, event, keep))

    def wait_next(self) -> bool:
        """(``thread=False``) Wait for the oldest transfer not yet waited for and settle
        its task; False when none is posted."""
        if not self.q:
            return False
        self._settle(*self.q.popleft())
        return True

    def drain(self) -> None:
        """(``thread=False``) Wait for every transfer posted, oldest first, each with
        the deadline; raise the first one's error (a CollectiveTimeout or
        CollectiveFailed naming it), dropping the rest."""
        while self.q:
            err = self._waited(self.q.popleft()[0])
            if err is not None:
                self.q.clear()
                raise err

    def _wait(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            self._settle(*item)
            item = None

    def _settle(self, handle: Handle, event: Event, keep: Any) -> None:
        err = self._waited(handle)
        del keep
        if err is None:
            event.fulfill()
        else:
            event.fail(err)

    def _waited(self, handle: Handle) -> BaseException | None:
        """Wait for ``handle`` with the deadline: None, or the error to fail with."""
        try:
            handle.wait(self.rank, self.timeout)
        except (KeyboardInterrupt, SystemExit):  # (wait_next, drain: the main thread)
            raise
        except BaseException as e:  # our deadline, gloo's, a peer's connection gone
            return self._named(handle, e)
        return None

    def _named(self, handle: Handle, e: BaseException) -> BaseException:
        """What the task fails with: a deadline passed (ours, or the library's own,
        such as gloo's "Application timeout caused pair closure") is a
        CollectiveTimeout, any other error a CollectiveFailed; either keeps the
        library's error as its cause."""
        if isinstance(e, CollectiveTimeout):
            return e
        if TIMED_OUT.search(str(e)):  # the library's own deadline (gloo's, NCCL's)
            err: BaseException = CollectiveTimeout(handle.what, self.rank, self.timeout)
            err.__cause__ = e
            return err
        return CollectiveFailed(handle.what, self.rank, e)

    def close(self) -> None:
        """Stop after the transfers posted, never waiting for them (a failing rank must
        not wait for the peer it may be failing because of: the thread is a daemon);
        with ``thread=False``, drop those not waited for."""
        if self.thread is not None:
            self.q.put(None)
        else:
            self.q.clear()
