"""The transfers of one direction of a pipeline stage (and one chunk), awaited in order.

A stage's send and receive tasks are detached: their body posts the transfer and
returns, and a :class:`Transfers` thread per direction (and chunk) waits for each transfer (with
the backend's deadline) in the order they were posted, then completes its task, or
fails it with a :class:`~dagtrain.sync.CollectiveTimeout` naming the transfer (or a
:class:`~dagtrain.sync.CollectiveFailed` carrying the library's error, such as a peer's
connection reset, as its cause). Transfers
of one direction between two ranks complete in the order they were posted (a channel's
messages do not overtake each other), so waiting in order delays none.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter
from typing import Any

from dagtrain.launch.diagnose import TIMED_OUT
from dagtrain.sync import CollectiveFailed, CollectiveTimeout, Handle
from dagtrain.taskgraph import Event

__all__ = ["Transfers"]


class Transfers:
    """A thread that waits, in the order they were posted, for the transfers of one
    direction, and completes each one's detached task (or fails it)."""

    def __init__(self, name: str, rank: int, timeout: float) -> None:
        self.rank, self.timeout = rank, timeout
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.done: list[tuple[str, float, float]] = []  # (name, posted, completed)
        self.thread = threading.Thread(target=self._wait, name=name, daemon=True)
        self.thread.start()

    def post(self, handle: Handle, event: Event, keep: Any, name: str) -> None:
        self.q.put((handle, event, keep, name, perf_counter()))

    def _wait(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            handle, event, keep, name, posted = item
            try:
                handle.wait(self.rank, self.timeout)
            except BaseException as e:  # our deadline, gloo's, a peer's connection gone
                event.fail(self._named(handle, e))
                continue
            self.done.append((name, posted, perf_counter()))
            del keep
            event.fulfill()

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
        """Stop after the transfers posted; never waits for them (a failing rank must
        not wait for the peer it may be failing because of: the thread is a daemon)."""
        self.q.put(None)
