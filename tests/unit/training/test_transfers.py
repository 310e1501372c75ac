"""A pipeline stage's transfers, waited for by a thread of their own or by the stage's
thread when it has nothing to start: in the order posted; a transfer that fails before
its deadline (a peer's connection reset) fails its task with the library's error as
the cause, not as a timeout it was not."""

from __future__ import annotations

import threading

import pytest

from dagtrain.sync import CollectiveFailed, CollectiveTimeout, Handle
from dagtrain.taskgraph import Event, TaskGraph
from dagtrain.training.rank.transfers import Transfers


@pytest.fixture(params=[True, False], ids=["own-thread", "stage-thread"])
def thread(request) -> bool:
    """Who waits: the transfers' own thread, or the stage's, when it is idle."""
    return request.param


def _run(handle: Handle, thread: bool) -> BaseException:
    waiter, event, g = Transfers("recv-act", 1, 0.3, thread=thread), Event(), TaskGraph()
    g.add(lambda: waiter.post(handle, event, None), name="recv", detach=event)
    try:
        with pytest.raises(Exception) as info:
            g.run(workers=1, idle=None if thread else waiter.wait_next)
    finally:
        waiter.close()
    return info.value.__cause__


def test_the_stage_thread_waits_in_the_order_posted_and_only_when_idle(thread):
    """Two receives and their forwards: each forward runs once its own transfer has
    ended, in the stage's thread; with ``thread=False`` nothing but the stage's thread
    waited, and a third transfer never waited for is dropped at close."""
    main = threading.get_ident()
    waiter = Transfers("recv-act", 1, 5.0, thread=thread)
    waited: list[tuple[str, int]] = []
    ran: list[tuple[str, int]] = []

    def handle(name: str) -> Handle:
        return Handle(name, block=lambda: waited.append((name, threading.get_ident())))

    g = TaskGraph()
    for k in range(2):
        ev = Event()
        g.add(waiter.post, handle(f"recv{k}"), ev, None, name=f"recv{k}", out=f"x{k}", detach=ev)
        g.add(lambda k=k: ran.append((f"F{k}", threading.get_ident())), name=f"F{k}", in_=f"x{k}")
    g.run(workers=1, idle=None if thread else waiter.wait_next)
    assert [n for n, _ in waited] == ["recv0", "recv1"]
    assert [n for n, _ in ran] == ["F0", "F1"] and {t for _, t in ran} == {main}
    assert all((t == main) != thread for _, t in waited), waited
    waiter.post(handle("recv2"), Event(), None)
    waiter.close()
    if not thread:
        assert not waiter.wait_next() and len(waited) == 2


def test_a_reset_connection_is_the_cause_of_a_failed_transfer(thread):
    def reset() -> bool:
        raise ConnectionResetError("Connection reset by peer")

    err = _run(Handle("recv-act3", test=reset), thread)
    assert isinstance(err, CollectiveFailed) and not isinstance(err, TimeoutError), err
    assert isinstance(err.__cause__, ConnectionResetError)
    assert str(err).startswith("rank 1: recv-act3 failed: ConnectionResetError: Connection")


def test_a_transfer_past_its_deadline_is_a_timeout_naming_it(thread):
    err = _run(Handle("recv-act4", test=lambda: False), thread)
    assert isinstance(err, CollectiveTimeout), err
    assert str(err).startswith("rank 1: recv-act4 did not finish within 0.3 s")
    # a transfer that names its rank first (a pipeline stage's) is not named twice
    what = "rank 1 (stage 1): receiving microbatch 4's activation from rank 0 (stage 0)"
    err = _run(Handle(what, test=lambda: False), thread)
    assert str(err).startswith(f"{what} did not finish within 0.3 s"), err


def test_the_librarys_own_deadline_is_a_timeout_with_its_error_as_cause(thread):
    def closed() -> bool:
        raise RuntimeError("Application timeout caused pair closure")

    err = _run(Handle("send-act1", test=closed), thread)
    assert isinstance(err, CollectiveTimeout), err
    assert "send-act1 did not finish within 0.3 s" in str(err)
    assert isinstance(err.__cause__, RuntimeError)


def test_sends_drained_at_the_steps_end_in_order_and_the_first_failure_named():
    """A chunked stage's sends: no task waits for them; ``drain`` waits for each, the
    oldest first, and raises the first failure naming it, dropping the rest."""
    waited: list[str] = []
    sends = Transfers("pipeline-sends", 1, 0.3, thread=False)
    for k in range(3):
        sends.post(Handle(f"send{k}", block=lambda k=k: waited.append(f"send{k}")), None, None)
    sends.drain()
    assert waited == ["send0", "send1", "send2"] and not sends.wait_next()

    def reset() -> bool:
        raise ConnectionResetError("Connection reset by peer")

    sends.post(Handle("send3", test=lambda: True), None, None)
    sends.post(Handle("send4", test=reset), None, None)
    sends.post(Handle("send5", block=lambda: waited.append("send5")), None, None)
    with pytest.raises(CollectiveFailed) as info:
        sends.drain()
    assert str(info.value).startswith("rank 1: send4 failed: ConnectionResetError")
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert "send5" not in waited and not sends.wait_next()  # the rest dropped
    sends.post(Handle("send6", test=lambda: False), None, None)
    with pytest.raises(CollectiveTimeout, match=r"send6 did not finish within 0\.3 s"):
        sends.drain()
