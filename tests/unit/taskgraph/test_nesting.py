"""Recursion and incremental use, checked against OpenMP's rules, in four parts:

* the task scheduling constraint: a thread waiting in a task body starts only
  descendants of that task, so waits nest as deep as the program, not the task count;
* a ``Ref`` in an incremental graph finds its value whenever its writer finished;
* ``taskwait`` with OpenMP's dependence kinds (``taskwait depend(...)``);
* ``Event.fulfill()`` before a run (and between runs) counts for the next run.

Tasks are held by detach events, never ordered by sleeps.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

import pytest

from dagtrain.taskgraph import Event, Ref, TaskError, TaskGraph, TaskTimeoutError

LIMIT = 200  # the recursion limit the nesting tests run under


@contextmanager
def recursion_limit(n: int):
    """Lower the recursion limit for the block (restored even when it fails)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(n)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def noop(*args, **kwargs):
    return None


# ------------------------------------------------------------------ 1. nesting bound
def fib_graph(n: int) -> tuple[TaskGraph, list]:
    """OpenMP Examples' tasking fib: each call spawns two tasks and taskwaits."""
    g = TaskGraph()

    def fib(n: int, out: list) -> None:
        if n < 2:
            out.append(n)
            return
        a: list = []
        b: list = []
        g.add(fib, n - 1, a, name=f"fib({n - 1})")
        g.add(fib, n - 2, b, name=f"fib({n - 2})")
        g.taskwait()
        out.append(a[0] + b[0])

    result: list = []
    g.add(fib, n, result, name=f"fib({n})")
    return g, result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_recursive_fib_20_runs_under_a_low_recursion_limit(workers):
    g, result = fib_graph(20)
    with recursion_limit(LIMIT):
        g.run(workers=workers)
    assert result == [6765]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_ten_thousand_task_tree_with_taskwaits_runs_under_a_low_limit(workers):
    g = TaskGraph()
    leaves: list = []

    def child(i: int) -> None:
        for j in range(100):
            g.add(leaves.append, (i, j), name=f"leaf{i}.{j}")
        g.taskwait()

    def root() -> None:
        for i in range(99):
            g.add(child, i, name=f"child{i}")
        g.taskwait()

    g.add(root, name="root")
    with recursion_limit(LIMIT):
        report = g.run(workers=workers)
    assert len(report) == 1 + 99 + 9900 == 10_000
    assert sorted(leaves) == [(i, j) for i in range(99) for j in range(100)]
    assert {r.state for r in report} == {"done"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_200_children_each_adding_one_task_and_waiting_for_it(workers):
    g = TaskGraph()

    def child() -> None:
        g.add(lambda: None)
        g.taskwait()

    def root() -> None:
        for i in range(200):
            g.add(child, name=f"child{i}")
        g.taskwait()

    g.add(root)
    with recursion_limit(LIMIT):
        report = g.run(workers=workers)
    assert len(report) == 401


def test_a_waiting_thread_starts_only_descendants_of_the_task_it_waits_in():
    # one worker: while "parent" waits for its child, the ready top-level task "other"
    # is not its descendant, so it runs only after parent, although it is ahead of the
    # children in the queue
    log: list = []
    g = TaskGraph()

    def parent() -> None:
        g.add(log.append, "child", name="child")
        g.add(grandparent_of_nothing, name="child2")
        g.taskwait()
        log.append("parent-after-wait")

    def grandparent_of_nothing() -> None:
        g.add(log.append, "grandchild", name="grandchild")  # a descendant: may run
        g.taskwait()

    g.add(parent, name="parent")
    g.add(log.append, "other", name="other")
    g.run(workers=1)
    assert log == ["child", "grandchild", "parent-after-wait", "other"]


def test_a_taskgroup_in_a_body_runs_grandchildren_whose_parent_returned():
    # "spawner" returns without waiting; the taskgroup still waits for its children,
    # and the thread waiting in "body" may run them (descendants), even at one worker
    log: list = []
    g = TaskGraph()

    def spawner(k: int) -> None:
        for j in range(3):
            g.add(log.append, (k, j), name=f"gc{k}.{j}")

    def body() -> None:
        with g.taskgroup():
            for k in range(3):
                g.add(spawner, k, name=f"spawner{k}")
        log.append("after-group")

    g.add(body, name="body")
    with recursion_limit(LIMIT):
        g.run(workers=1)
    assert log[-1] == "after-group" and len(log) == 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, 4])
def test_children_values_and_waits_replay(workers):
    g, result = fib_graph(12)
    for _ in range(3):  # each run makes the children anew
        result.clear()
        g.run(workers=workers)
        assert result == [144]
    assert len(g) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_wait_only_a_non_descendant_could_end_times_out_naming_the_tasks(workers):
    # (the documented limitation) "c" is fulfilled by "r", not a descendant of "p":
    # while every thread waits in a body, nothing starts r; the run's timeout ends it
    ev = Event()
    g = TaskGraph()

    def p() -> None:
        g.add(noop, name="c", detach=ev)
        g.taskwait()

    def blocker(k: int) -> None:
        g.add(noop, name=f"held{k}", detach=Event())
        g.taskwait()

    g.add(p, name="p")
    for k in range(workers - 1):  # keeps the other threads waiting in bodies too
        g.add(blocker, k, name=f"blocker{k}")
    g.add(ev.fulfill, name="r")
    with pytest.raises(TaskTimeoutError, match=r"'p'.*'c'|'c'.*'p'"):
        g.run(workers=workers, timeout=0.3)
    assert g.tasks[0].state == "cancelled"


def test_a_graph_whose_bodies_add_children_never_replays_inline():
    # tiny tasks would replay inline (no run: a body's add would grow the graph)
    g = TaskGraph()
    g.add(lambda: g.add(noop, name="child"), name="parent")
    for i in range(2000):
        g.add(noop, name=f"t{i}")
    for _ in range(3):
        report = g.run(workers=2)
        assert len(g) == 2001 and len(report) == 2002


# ------------------------------------------------------------------ 2. Ref timing
@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay", [0.0, 0.001])
def test_a_ref_finds_its_value_whatever_the_timing(delay):
    # a reader added while the graph runs, right after its writer or 1 ms later (when
    # the writer has often finished): it gets the writer's value every time
    for i in range(200):
        g = TaskGraph()
        got: list = []
        g.start(workers=2)
        g.add(lambda i=i: i, name="writer", out="x")
        if delay:
            time.sleep(delay)  # timing only varies; correctness must not depend on it
        g.add(got.append, Ref("x"), name="reader")
        g.join()
        assert got == [i]


def test_a_ref_added_after_its_writer_finished():
    g = TaskGraph()
    got: list = []
    g.start(workers=2)
    w = g.add(lambda: 2, name="writer", out="x")
    g.taskwait()  # the writer has finished, and nobody read x yet
    assert w.state == "done"
    g.add(got.append, Ref("x"), name="reader")
    g.add(lambda: 5, name="writer2", out="x")  # a new version: the old one may go
    g.add(got.append, Ref("x"), name="reader2")
    g.join()
    assert got == [2, 5]


def test_a_ref_added_while_its_writer_is_held():
    gate = Event()
    g = TaskGraph()
    got: list = []
    g.start(workers=2)
    g.add(lambda: 7, name="writer", out="x", detach=gate)
    g.add(got.append, Ref("x"), name="reader")
    gate.fulfill()
    g.join()
    assert got == [7]


def test_a_ref_to_a_writer_added_before_start():
    g = TaskGraph()
    got: list = []
    g.add(lambda: 3, name="writer", out="x")
    g.add(lambda: 4, name="unread", out="y")
    g.start(workers=2)
    g.taskwait()
    g.add(got.append, Ref("x"), name="reader")
    g.join()
    assert got == [3]
    # the slot kept for y, which nobody read, is gone: a replay does not publish it
    assert g.tasks[1].x is None
    got.clear()
    g.run(workers=2)  # the graph built incrementally replays, values included
    assert got == [3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_child_ref_added_after_its_sibling_writer_finished(workers):
    got: list = []
    g = TaskGraph()

    def parent() -> None:
        g.add(lambda: 11, name="writer", out="x")
        g.taskwait()  # the writer is done before its reader exists
        g.add(got.append, Ref("x"), name="reader")

    g.add(parent, name="parent")
    for _ in range(3):
        got.clear()
        g.run(workers=workers)
        assert got == [11]


# ------------------------------------------------------------------ 3. taskwait clauses
# (tasks on the item, in add order: (name, clause, item)), taskwait clauses, the
# earlier tasks guaranteed finished when it returns. Every task is held by its detach
# event; a "release" task fulfils exactly the events of the expected set, so a task
# outside it can never be done, and one inside it must be.
WAITS = [
    ([("w", "out", "x"), ("r", "in_", "x")], {"in_": "x"}, {"w"}),
    ([("w", "out", "x"), ("r", "in_", "x")], {"out": "x"}, {"w", "r"}),
    ([("w", "out", "x"), ("r", "in_", "x")], {"inout": "x"}, {"w", "r"}),
    ([("w", "out", "x"), ("r", "in_", "x")], {"on": "x"}, {"w", "r"}),
    (
        [
            ("r0", "in_", "x"),
            ("w1", "out", "x"),
            ("r1", "in_", "x"),
            ("w2", "inout", "x"),
            ("r2", "in_", "x"),
        ],
        {"in_": "x"},
        {"r0", "w1", "r1", "w2"},
    ),
    ([("r0", "in_", "x"), ("r1", "in_", "x")], {"in_": "x"}, set()),
    ([("r0", "in_", "x"), ("r1", "in_", "x")], {"out": "x"}, {"r0", "r1"}),
    (
        [("w", "out", "x"), ("m1", "mutexinoutset", "x"), ("m2", "mutexinoutset", "x")],
        {"in_": "x"},
        {"w", "m1", "m2"},
    ),
    (
        [("w", "out", "x"), ("m1", "mutexinoutset", "x"), ("m2", "mutexinoutset", "x")],
        {"mutexinoutset": "x"},
        {"w"},
    ),
    (
        [("w", "out", "x"), ("m1", "mutexinoutset", "x"), ("m2", "mutexinoutset", "x")],
        {"inoutset": "x"},
        {"w", "m1", "m2"},
    ),
    (
        [("w", "out", "x"), ("m1", "mutexinoutset", "x"), ("r", "in_", "x")],
        {"mutexinoutset": "x"},
        {"w", "m1", "r"},
    ),
    (
        [("w", "out", "x"), ("s1", "inoutset", "x"), ("s2", "inoutset", "x")],
        {"inoutset": "x"},
        {"w"},
    ),
    (
        [("w", "out", "x"), ("s1", "inoutset", "x"), ("s2", "inoutset", "x")],
        {"in_": "x"},
        {"w", "s1", "s2"},
    ),
    (
        [("w", "out", "x"), ("s1", "inoutset", "x"), ("s2", "inoutset", "x")],
        {"out": "x"},
        {"w", "s1", "s2"},
    ),
    (
        [("w", "out", "x"), ("s1", "inoutset", "x"), ("r", "in_", "x")],
        {"inoutset": "x"},
        {"w", "s1", "r"},
    ),
    ([("w", "out", "x"), ("v", "out", "y"), ("r", "in_", "x")], {"in_": "x"}, {"w"}),
    (
        [("w", "out", "x"), ("v", "out", "y"), ("r", "in_", "x")],
        {"in_": "x", "out": "y"},
        {"w", "v"},
    ),
    ([("w", "out", "x"), ("v", "out", "y")], {"in_": ["x", "y"]}, {"w", "v"}),
    ([("w", "out", "x"), ("v", "out", "y")], {"in_": "z"}, set()),
    ([("w", "out", "x"), ("r", "in_", "x")], {"in_": "x", "out": "x"}, {"w", "r"}),  # as inout
]


def held_siblings(g: TaskGraph, spec, expected):
    """Add the held tasks and the release task; return {name: (task, event)}."""
    held = {}
    for name, clause, item in spec:
        ev = Event()
        held[name] = (g.add(noop, name=name, detach=ev, **{clause: item}), ev)
    for name in expected:
        held[name][1].fulfill()  # during the run: counts when the task's function returns
    return held


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize(("spec", "clauses", "expected"), WAITS)
def test_taskwait_clauses_at_top_level(spec, clauses, expected, workers):
    g = TaskGraph()
    g.start(workers=workers)
    try:
        held = held_siblings(g, spec, expected)
        g.taskwait(**clauses)
        finished = {n for n, (t, _) in held.items() if t.state == "done"}
    finally:
        for _, ev in held.values():
            ev.fulfill()
        g.join(timeout=10)
    assert finished == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize(("spec", "clauses", "expected"), WAITS)
def test_taskwait_clauses_in_a_task_body(spec, clauses, expected, workers):
    g = TaskGraph()
    seen: dict = {}

    def body() -> None:
        held = held_siblings(g, spec, expected)
        g.taskwait(**clauses)
        seen["finished"] = {n for n, (t, _) in held.items() if t.state == "done"}
        for _, ev in held.values():
            ev.fulfill()

    g.add(body, name="body")
    g.run(workers=workers, timeout=10)
    assert seen["finished"] == expected


def test_taskwait_held_by_events_fulfilled_by_a_sibling_the_waiter_runs():
    # one worker, nothing runs before the wait: taskwait(in_=x) must run "w" and the
    # releaser itself, and return as soon as w is done, leaving the reader detached
    evs = {n: Event() for n in ("w", "r")}
    g = TaskGraph()
    g.start(workers=1)
    w = g.add(noop, name="w", out="x", detach=evs["w"])
    r = g.add(noop, name="r", in_="x", detach=evs["r"])
    g.add(evs["w"].fulfill, name="release-w")
    assert w.state == "ready"  # nothing has run: the wait below really waits
    g.taskwait(in_="x")
    assert w.state == "done" and r.state != "done"
    evs["r"].fulfill()
    g.join(timeout=10)


def test_taskwait_without_items_waits_for_all():
    g = TaskGraph()
    g.start(workers=2)
    ts = [g.add(noop, name=f"t{i}", out=f"i{i}") for i in range(5)]
    g.taskwait(in_=[])  # no item named: the plain taskwait
    assert all(t.state == "done" for t in ts)
    g.join()


# ------------------------------------------------------------------ 4. early fulfil
@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 2])
def test_fulfil_before_the_run_counts_when_the_task_reaches_it(workers):
    ev = Event()
    g = TaskGraph()
    g.add(noop, name="send", out="g", detach=ev)
    g.add(noop, name="use", in_="g")
    ev.fulfill()  # before run(): kept for it
    assert "fulfilled early" in repr(ev)
    report = g.run(workers=workers, timeout=10)
    assert {r.state for r in report} == {"done"} and ev.fulfilled


def test_fulfil_before_start_counts_too():
    ev = Event()
    g = TaskGraph()
    g.add(noop, name="send", out="g", detach=ev)
    ev.fulfill()
    g.start(workers=2)
    g.add(noop, name="use", in_="g")
    assert {r.state for r in g.join(timeout=10)} == {"done"}


def test_fail_before_the_run_fails_the_task_when_it_reaches_it():
    ev = Event()
    g = TaskGraph()
    g.add(noop, name="send", out="g", detach=ev)
    g.add(noop, name="use", in_="g")
    ev.fail(ConnectionError("peer gone"))
    with pytest.raises(TaskError, match="send") as info:
        g.run(workers=2, timeout=10)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert g.tasks[1].state == "cancelled"


def test_on_replay_only_a_fulfil_made_since_the_last_run_counts():
    ev = Event()
    g = TaskGraph()
    g.add(noop, name="send", out="g", detach=ev)
    g.add(ev.fulfill, name="hook", in_="g2")  # fulfils it during every run
    g.add(noop, name="use", in_="g")
    g.run(workers=2, timeout=10)
    g.run(workers=2, timeout=10)  # re-armed, fulfilled again by the hook
    assert ev.fulfilled

    h = TaskGraph()
    ev2 = Event()
    h.add(noop, name="send", out="g", detach=ev2)
    ev2.fulfill()  # early, for the first run
    h.run(workers=2, timeout=10)
    # the first run's fulfil does not carry over: the replay waits for a new one
    with pytest.raises(TaskTimeoutError, match="send"):
        h.run(workers=2, timeout=0.2)
    # a late fulfil of that timed-out run is dropped; the next one counts (early)
    ev2.fulfill()
    assert "pending" in repr(ev2)
    ev2.fulfill()
    assert "fulfilled early" in repr(ev2)
    h.run(workers=2, timeout=10)
    ev2.fulfill()  # between runs after a run that completed: early for the next run
    ev2.fulfill()  # repeated: a no-op
    h.run(workers=2, timeout=10)
    with pytest.raises(TaskTimeoutError):
        h.run(workers=2, timeout=0.2)


@pytest.mark.timeout(60)
def test_a_fulfil_racing_with_the_start_of_a_run_is_never_lost():
    # the fulfil may land before run() arms the event (early) or after (during the
    # run): either way the run completes
    for _ in range(200):
        ev = Event()
        g = TaskGraph()
        g.add(noop, name="send", detach=ev)
        go = threading.Event()
        th = threading.Thread(target=lambda: (go.wait(), ev.fulfill()))
        th.start()
        go.set()
        g.run(workers=2, timeout=10)
        th.join()
