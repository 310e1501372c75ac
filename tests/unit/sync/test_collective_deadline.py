"""The deadline of every blocking collective wait: one watchdog thread per process,
armed and disarmed per wait (no thread started per collective)."""

from __future__ import annotations

import threading
import time

from dagtrain.sync.base import CollectiveTimeout, Handle


def test_a_wait_past_its_deadline_gets_on_timeout_with_the_collective_named():
    fired: list[tuple[float, CollectiveTimeout]] = []
    done = threading.Event()
    t0 = time.monotonic()

    def on_timeout(err: CollectiveTimeout) -> None:
        fired.append((time.monotonic() - t0, err))
        done.set()  # what an abort does: the blocked wait ends

    Handle("bucket3", block=lambda: done.wait(10), on_timeout=on_timeout).wait(1, 0.2)
    ((after, err),) = fired
    assert 0.2 <= after < 1.0
    assert (err.what, err.rank, err.timeout) == ("bucket3", 1, 0.2)
    assert "bucket3 did not finish within 0.2 s" in str(err)


def test_waits_in_time_start_no_thread_and_never_fire():
    fired: list[object] = []
    finished: list[int] = []
    Handle("warm-up", block=lambda: None).wait(0, 60)  # the watchdog exists from here on
    threads = threading.active_count()
    for i in range(200):
        Handle(
            f"bucket{i}",
            block=lambda: None,
            finish=lambda i=i: finished.append(i),
            on_timeout=fired.append,
        ).wait(0, 0.05)
    assert threading.active_count() == threads
    time.sleep(0.3)  # past every deadline: all were disarmed
    assert fired == [] and finished == list(range(200))
