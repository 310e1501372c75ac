"""A pipeline stage's transfers: a transfer that fails before its deadline (a peer's
connection reset) fails its task with the library's error as the cause, not as a
timeout it was not."""

from __future__ import annotations

import pytest

from dagtrain.sync import CollectiveFailed, CollectiveTimeout, Handle
from dagtrain.taskgraph import Event, TaskGraph
from dagtrain.training.rank.transfers import Transfers


def _run(handle: Handle) -> BaseException:
    waiter, event, g = Transfers("recv-act", 1, 0.3), Event(), TaskGraph()
    g.add(lambda: waiter.post(handle, event, None, handle.what), name="recv", detach=event)
    try:
        with pytest.raises(Exception) as info:
            g.run(workers=1)
    finally:
        waiter.close()
    return info.value.__cause__


def test_a_reset_connection_is_the_cause_of_a_failed_transfer():
    def reset() -> bool:
        raise ConnectionResetError("Connection reset by peer")

    err = _run(Handle("recv-act3", test=reset))
    assert isinstance(err, CollectiveFailed) and not isinstance(err, TimeoutError), err
    assert isinstance(err.__cause__, ConnectionResetError)
    assert str(err).startswith("rank 1: recv-act3 failed: ConnectionResetError: Connection")


def test_a_transfer_past_its_deadline_is_a_timeout_naming_it():
    err = _run(Handle("recv-act4", test=lambda: False))
    assert isinstance(err, CollectiveTimeout), err
    assert "recv-act4 did not finish within 0.3 s" in str(err)


def test_the_librarys_own_deadline_is_a_timeout_with_its_error_as_cause():
    def closed() -> bool:
        raise RuntimeError("Application timeout caused pair closure")

    err = _run(Handle("send-act1", test=closed))
    assert isinstance(err, CollectiveTimeout), err
    assert "send-act1 did not finish within 0.3 s" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
