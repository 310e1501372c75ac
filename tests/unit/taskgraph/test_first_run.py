"""The first run of a plain graph: inline while its tasks are tiny, handed to the team
as soon as they are not (dagtrain/taskgraph/inline.py, ``run_inline``).

Hand-overs are forced with events, never ordered by sleeps: a task that waits for an
event only a later, independent task sets can finish only if the run handed that task
to another worker (or, for a body that adds tasks, ran its children).
"""

from __future__ import annotations

import random
import threading

import pytest

from dagtrain.taskgraph import TaskError, TaskGraph, inline

from .ordering import assert_ran_in_order

WAIT = 30.0  # seconds: a deadline for every wait, far above what any run here takes


def noop(*args, **kwargs):
    return None


def test_a_first_run_of_tiny_tasks_runs_inline_in_program_order(monkeypatch):
    # (a long tick: a caller preempted on a loaded machine must not look like a long task)
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)
    log: list[int] = []
    g = TaskGraph()
    for i in range(200):
        g.add(log.append, i, name=f"t{i}", out=i % 7, in_=(i - 1) % 7)
    r = g.run(workers=4)
    assert log == list(range(200))  # program order: a topological order, one thread
    assert set(r.workers_of) == {0} and set(r.states) == {"done"}
    assert [t.state for t in g.tasks] == ["done"] * 200


@pytest.mark.parametrize("workers", [2, 3])
def test_a_long_task_hands_the_independent_ones_to_other_workers(workers):
    # "first" runs inline and blocks until "second" (independent, later in the order)
    # has run: only a hand-over to another worker can get it done
    ev = threading.Event()
    g = TaskGraph()
    g.add(lambda: ev.wait(WAIT) or pytest.fail("never handed over"), name="first", out="a")
    for i in range(20):
        g.add(noop, name=f"tiny{i}", out=("t", i))
    g.add(ev.set, name="second", out="b")
    g.add(noop, name="after_first", in_="a")
    g.add(noop, name="after_both", in_=["a", "b"])
    r = g.run(workers=workers)
    rec = r.tasks
    assert rec["first"].worker == 0 and rec["second"].worker != 0
    assert set(r.states) == {"done"}
    for name in ("after_first", "after_both"):
        assert rec[name].start >= rec["first"].end
    assert rec["after_both"].start >= rec["second"].end


def test_the_task_in_hand_at_the_hand_over_completes_its_successors_once():
    calls: dict[str, int] = {}
    ev = threading.Event()

    def count(name):
        calls[name] = calls.get(name, 0) + 1

    g = TaskGraph()
    for i in range(30):  # tiny tasks done inline before the hand-over
        g.add(count, f"pre{i}", name=f"pre{i}", inout="chain")
    g.add(lambda: (ev.wait(WAIT), count("hand")), name="hand", inout="chain")
    g.add(ev.set, name="setter")
    for i in range(30):  # successors of the task in hand, and of each other
        g.add(count, f"post{i}", name=f"post{i}", inout="chain")
    r = g.run(workers=2)
    assert set(r.states) == {"done"}
    assert calls == {**{f"pre{i}": 1 for i in range(30)}, "hand": 1} | {
        f"post{i}": 1 for i in range(30)
    }
    ends = {rec.name: rec for rec in r}
    assert ends["post0"].start >= ends["hand"].end


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_body_that_adds_tasks_in_a_first_run_gets_a_running_graph(workers):
    g = TaskGraph()
    out: list[int] = []

    def fib(n: int) -> int:
        if n < 2:
            return n
        res = [0, 0]

        def put(i, m):
            res[i] = fib(m)

        g.add(put, 0, n - 1, name=f"fib{n - 1}")
        g.add(put, 1, n - 2, name=f"fib{n - 2}")
        g.taskwait()
        return res[0] + res[1]

    for i in range(50):  # tiny tasks first: the probe is inline when fib adds
        g.add(noop, name=f"t{i}")
    g.add(lambda: out.append(fib(12)), name="root")
    g.run(workers=workers)
    assert out == [144]


def test_a_failure_in_an_inline_first_run_is_a_task_error_and_cancels_the_rest():
    g = TaskGraph()
    g.add(noop, name="a", out="x")
    g.add(lambda: 1 / 0, name="bad", in_="x", out="y")
    g.add(noop, name="c", in_="y")
    with pytest.raises(TaskError, match="'bad'") as info:
        g.run(workers=2)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert [t.state for t in g.tasks] == ["done", "failed", "cancelled"]
    assert not [t for t in threading.enumerate() if t.name.startswith("taskgraph-worker")]


def test_a_failure_after_the_hand_over_is_a_task_error_and_the_rest_is_cancelled():
    ev = threading.Event()

    def bad():
        ev.set()
        raise ValueError("boom")

    g = TaskGraph()
    g.add(lambda: ev.wait(WAIT), name="first", out="a")
    g.add(bad, name="bad", out="b")
    g.add(noop, name="never", in_=["a", "b"])
    with pytest.raises(TaskError, match="'bad'") as info:
        g.run(workers=2)
    assert isinstance(info.value.__cause__, ValueError)
    assert [t.state for t in g.tasks] == ["done", "failed", "cancelled"]


def test_no_thread_outlives_a_first_run():
    before = set(threading.enumerate())
    for long in (False, True):
        ev = threading.Event()
        g = TaskGraph()
        g.add(lambda: ev.wait(WAIT) if long else None, name="first")
        g.add(ev.set, name="second")
        g.run(workers=3)
    assert set(threading.enumerate()) == before


def test_the_next_run_knows_the_grain_and_replays_inline():
    g = TaskGraph()
    for i in range(100):
        g.add(noop, name=f"t{i}", inout="x")
    # (a generous inline_below: a preempted noop must not make this test flaky)
    g.run(workers=2, inline_below=1e-3)
    assert g._grain is not None and g._grain < 1e-3
    r = g.run(workers=2, inline_below=1e-3)
    assert set(r.workers_of) == {0}
    r = g.run(workers=2, inline_below=0)  # never inline: the team
    assert set(r.states) == {"done"}


@pytest.mark.parametrize("seed", range(12))
def test_random_first_runs_keep_every_dependence(seed):
    # random programs whose tasks are mostly tiny, some waiting for an event a later
    # task sets (so the run hands over at a random point), at 1-4 workers
    rng = random.Random(seed)
    workers = rng.randint(1, 4)
    n = rng.randint(50, 400)
    names = [f"v{i}" for i in range(rng.randint(2, 12))]
    events = [threading.Event() for _ in range(3)]
    log: list[int] = []
    lock = threading.Lock()
    g = TaskGraph()
    preds: dict[int, set[int]] = {}
    writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    waiters = set()
    for i in range(n):
        ins = rng.sample(names, k=rng.randint(0, 2))
        outs = rng.sample(names, k=rng.randint(0, 1))
        p = set()
        for x in ins:
            if x in writer:
                p.add(writer[x])
        for x in outs:
            p.update(readers.get(x, ()))
            if x in writer:
                p.add(writer[x])
        for x in ins:
            readers.setdefault(x, []).append(i)
        for x in outs:
            writer[x] = i
            readers[x] = []
        p.discard(i)
        preds[i] = p
        # (fewer waiters than workers: one worker is always left to reach the setters)
        if not p and rng.random() < 0.02 and len(waiters) < min(len(events), workers - 1):
            ev = events[len(waiters)]
            waiters.add(i)

            def wait_then_log(i=i, ev=ev):
                assert ev.wait(WAIT), "never handed over"
                with lock:
                    log.append(i)

            g.add(wait_then_log, name=f"t{i}", in_=ins, out=outs)
        else:

            def do(i=i):
                with lock:
                    log.append(i)

            g.add(do, name=f"t{i}", in_=ins, out=outs)
    for k in range(len(waiters)):  # independent setters, after everything else
        g.add(events[k].set, name=f"set{k}")
    assert_ran_in_order(log, preds, n, g.run(workers=workers))


@pytest.mark.parametrize("workers", [1, 2])
def test_an_inline_replay_whose_body_waits_gets_a_running_graph(workers):
    g = TaskGraph()
    for i in range(20):
        g.add(noop, name=f"t{i}")
    g.add(lambda: g.taskwait(), name="waits")  # (nothing to wait for: a no-op wait)
    g.run(workers=workers, inline_below=1e-3)
    assert g._grain is not None  # no children: the next run is a replay, inline
    r = g.run(workers=workers, inline_below=1e-3)
    assert set(r.states) == {"done"}
