"""The probed first run (dagtrain/taskgraph/inline.py, ``run_inline``): the
interleavings of the calling thread and the helper around the hand-over, forced with
events (a stalled hook in the helper's ``take_over``, or in the caller's clock reads),
never with sleeps.

The first tests pin the races of the hand-over itself (a comment above each says
which); the others, runs handed over at chosen or at natural times.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

import pytest

from dagtrain.taskgraph import TaskError, TaskGraph, inline
from dagtrain.taskgraph.task import Task

from .ordering import assert_ran_in_order

WAIT = 30.0  # seconds: a deadline for every wait, far above what any run here takes
LIVE = ("pending", "ready", "running", "parked", "detached")  # never left after a run


def noop(*args, **kwargs):
    return None


def workers_alive(g: TaskGraph) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"{g.name}-worker-")]


def stop_leaked(g: TaskGraph) -> None:
    """Stop and join the worker threads a run of ``g`` left behind (were a run to
    leave some, the test fails without hanging the others)."""
    for th in threading.enumerate():
        if not th.name.startswith(f"{g.name}-worker-"):
            continue
        if th.name.endswith("-worker-1") and th._args:  # the helper: (run, probe)
            run, probe = th._args
        else:
            run, probe = th._target.__self__, None
        with run.lock:
            if probe is not None:
                probe.over = True
            run.stopping = run.closing = True
            run.cond.notify_all()
        th.join(WAIT)


def wrap_take_over(monkeypatch) -> threading.Event:
    """Patch inline.take_over (the helper's and hand_over's) to set an event after it."""
    took = threading.Event()
    real = inline.take_over

    def take_over(run, probe):
        real(run, probe)
        took.set()

    monkeypatch.setattr(inline, "take_over", take_over)
    return took


def look_now(g: TaskGraph) -> None:
    """Wake the helper of g's probing run for a look (with PROBE_TICK patched long, it
    looks only when woken: no look depends on the machine's speed)."""
    run = g._run
    with run.lock:
        run.cond.notify_all()


# ------------------------------------------------------------ hand-over races


class _StallInTakeOver(Task):
    """A task the caller finished inline, whose successors (the task itself is their
    list) the helper's take_over iterates (counting it done) before it sets
    ``run.current[0]`` / ``run.wid_of[caller]`` and clears ``run.probe``. The first time,
    it stalls there until the task body in the caller is done with its add/taskwait, or
    is blocked on the run's lock (take_over holds it throughout). Set as the task's
    class: the same record, another ``__iter__``."""

    __slots__ = ()
    caller = inside = resume = None

    def __iter__(self):
        cls = type(self)
        if threading.get_ident() != cls.caller and not cls.inside.is_set():
            cls.inside.set()
            deadline = time.monotonic() + WAIT
            while not cls.resume.wait(1e-3) and time.monotonic() < deadline:
                frame = sys._current_frames().get(cls.caller)
                if frame is not None and frame.f_code.co_name == "hand_over":
                    break  # the body waits for the lock this take_over holds
        return super().__iter__()


# take_over registers the caller (wid_of/current) before it clears run.probe: a body
# in the caller that adds or waits while the helper takes over gets the running graph
# (were run.probe cleared first, it would skip hand_over and Run._wid raise
# RuntimeError)
@pytest.mark.parametrize("call", ["add", "taskwait", "taskgroup"])
def test_a_body_that_adds_while_the_helper_takes_over_gets_the_running_graph(call, monkeypatch):
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)  # the helper looks when woken
    caller = threading.get_ident()
    inside, resume = threading.Event(), threading.Event()
    out: list[int] = []
    g = TaskGraph()

    def parent():
        look_now(g)  # "first" is done, "parent" in hand: the helper takes over
        assert inside.wait(WAIT), "the helper never took over"
        try:  # (the helper is inside take_over, the run's lock held, run.probe None)
            if call == "add":
                g.add(out.append, 1, name="child")
                g.taskwait()
            elif call == "taskwait":
                g.taskwait()
                out.append(1)
            else:
                with g.taskgroup():
                    g.add(out.append, 1, name="child")
        finally:
            resume.set()

    first = g.add(noop, name="first", out="a")
    g.add(parent, name="parent")
    g.add(noop, name="after_first", in_="a")
    g.prepare()
    stall = type("Stall", (_StallInTakeOver,), {"__slots__": ()})
    stall.caller, stall.inside, stall.resume = caller, inside, resume
    first.__class__ = stall
    r = g.run(workers=2, inline_below=1e-9)
    assert out == [1]
    assert not [s for s in r.states if s in LIVE]


# an exception raised in run_inline outside a task body (KeyboardInterrupt at
# mark(perf()) or at the loop's jump) stops the helper and joins it before run()
# raises: no task starts after that, no thread is left running, no task pending
def test_an_interrupt_between_inline_tasks_stops_the_run(monkeypatch):
    real = inline.perf_counter
    caller = threading.get_ident()
    calls = [0]

    def perf():  # the caller's clock reads: t0, then one after each task
        if threading.get_ident() == caller:
            calls[0] += 1
            if calls[0] == 3:  # Ctrl-C arrives as task "b" returns (before its mark)
                raise KeyboardInterrupt
        return real()

    monkeypatch.setattr(inline, "perf_counter", perf)
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)  # the helper never looks on its own
    late = threading.Event()
    g = TaskGraph(name="interrupted")
    g.add(noop, name="a", out="x")
    g.add(noop, name="b", in_="x", out="y")
    g.add(noop, name="after_b", in_="y")
    g.add(late.set, name="late")  # independent: nobody may start it after the interrupt
    try:
        with pytest.raises(KeyboardInterrupt):
            g.run(workers=2)
        alive = workers_alive(g)
        states = [t.state for t in g.tasks]
        running = g._run
    finally:
        stop_leaked(g)
    assert alive == []
    assert running is None
    assert not [s for s in states if s in LIVE], states
    assert not late.is_set()


# the helper may look before the caller has set probe.t0 (still 0.0): it does not take
# over then (that would run tasks that start before run.t0, negative starts in the
# report and trace, and a first run of tiny tasks would not be inline)
def test_no_task_starts_before_the_run_when_the_caller_is_preempted(monkeypatch):
    real = inline.perf_counter
    caller = threading.get_ident()
    ran = threading.Event()
    first = [True]

    def perf():
        if first[0] and threading.get_ident() == caller:
            first[0] = False  # the caller is preempted between helper.start() and t0:
            ran.wait(0.5)  # (ends at once if the helper took over and ran task "a")
        return real()

    monkeypatch.setattr(inline, "perf_counter", perf)
    g = TaskGraph()
    g.add(ran.set, name="a")
    g.add(noop, name="b")
    r = g.run(workers=2)
    assert min(r.starts) >= 0, list(zip(r.names, r.starts, r.workers_of))


# a look before the first task ended hands over only once that task has run a tick (as
# the docs say), not on _watch's mean test `now - t0 >= n * inline_below`, which holds
# at n == 0 whatever the task's age (were it used, the helper, not the caller, could
# run 'first' in test_first_run.py::test_a_long_task_hands_the_independent_ones_to_other_workers)
def test_a_look_before_any_task_ended_waits_for_the_task_in_hand_to_run_a_tick(monkeypatch):
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)  # looks only when woken
    took = wrap_take_over(monkeypatch)
    real = inline.perf_counter
    caller = threading.get_ident()
    looked = threading.Event()

    def perf():
        if threading.get_ident() != caller:
            looked.set()  # (the helper reads the clock as it looks)
        return real()

    monkeypatch.setattr(inline, "perf_counter", perf)
    g = TaskGraph()

    def first():  # in hand for far less than a tick while the helper looks
        look_now(g)
        assert looked.wait(WAIT), "the helper never looked"
        with g._run.lock:  # (the look is over once the lock is free again)
            pass

    g.add(first, name="first")
    for i in range(10):
        g.add(noop, name=f"t{i}")
    r = g.run(workers=2)
    assert not took.is_set()
    assert set(r.workers_of) == {0}


# ------------------------------------------------------------ interleavings


def test_a_hand_over_between_a_task_s_end_and_the_next_counts_it_done_once(monkeypatch):
    # the caller recorded task K-1's end and has not taken the next: the helper finds
    # nothing in hand (len(ends) == claimed) and the caller retires nothing
    K = 5
    caller = threading.get_ident()
    took = wrap_take_over(monkeypatch)

    class Ends(list):
        def append(self, x):
            list.append(self, x)
            if len(self) == K and threading.get_ident() == caller:
                look_now(g)
                assert took.wait(WAIT), "the helper never took over"

    class Probe(inline.Probe):
        __slots__ = ()

        def __init__(self, order, inline_below, watched):
            super().__init__(order, inline_below, watched)
            self.ends = Ends()

    monkeypatch.setattr(inline, "Probe", Probe)
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def count(name):
        with lock:
            calls[name] = calls.get(name, 0) + 1

    g = TaskGraph()
    for i in range(3 * K):
        g.add(count, f"t{i}", name=f"t{i}", inout=i % 2)
    r = g.run(workers=2, inline_below=1e-9)  # (woken, the helper takes over)
    assert calls == {f"t{i}": 1 for i in range(3 * K)}
    assert set(r.states) == {"done"}
    assert list(r.workers_of[:K]) == [0] * K
    for i in range(2, 3 * K):
        assert r[f"t{i}"].start >= r[f"t{i - 2}"].end
    assert g._grain is not None and not workers_alive(g)


def test_a_failure_inline_that_the_helper_takes_over_before_it_is_reported(monkeypatch):
    # task "bad" raised; before the caller takes the lock to report it, the helper takes
    # over with "bad" in the caller's hand: the run fails with it, nothing left running
    caller = threading.get_ident()
    took = wrap_take_over(monkeypatch)
    real = inline.perf_counter
    state = {"bad_raised": False}

    def perf():
        if state["bad_raised"] and threading.get_ident() == caller:
            state["bad_raised"] = False  # failed = (task, e, perf()): stall here
            look_now(g)
            assert took.wait(WAIT), "the helper never took over"
        return real()

    def bad():
        state["bad_raised"] = True
        raise ValueError("boom")

    monkeypatch.setattr(inline, "perf_counter", perf)
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)
    g = TaskGraph()
    g.add(noop, name="a", out="x")
    g.add(bad, name="bad", in_="x", out="y")
    g.add(noop, name="after_bad", in_="y")
    for i in range(10):
        g.add(noop, name=f"free{i}")
    with pytest.raises(TaskError, match="'bad'") as info:
        g.run(workers=3, inline_below=1e-9)
    assert isinstance(info.value.__cause__, ValueError)
    states = {t.name: t.state for t in g.tasks}
    assert states["a"] == "done" and states["bad"] == "failed"
    assert states["after_bad"] == "cancelled"
    assert not [s for s in states.values() if s in LIVE]
    assert g._run is None and g._grain is None and not workers_alive(g)


@pytest.mark.parametrize("workers", [2, 3])
def test_the_task_in_hand_fails_after_the_hand_over(workers):
    ev = threading.Event()

    def first():
        assert ev.wait(WAIT), "never handed over"
        raise ValueError("late")

    g = TaskGraph()
    g.add(first, name="first", out="a")
    g.add(noop, name="after_first", in_="a")
    g.add(ev.set, name="setter", out="b")
    g.add(noop, name="after_setter", in_="b")
    with pytest.raises(TaskError, match="'first'") as info:
        g.run(workers=workers)
    assert isinstance(info.value.__cause__, ValueError)
    states = {t.name: t.state for t in g.tasks}
    assert states["first"] == "failed" and states["setter"] == "done"
    assert states["after_first"] == "cancelled"
    assert not [s for s in states.values() if s in LIVE]
    assert g._run is None and not workers_alive(g)


@pytest.mark.parametrize("handed", [False, True])
def test_a_keyboard_interrupt_in_a_task_body_is_re_raised_and_stops_the_run(handed):
    ev = threading.Event()
    once = [True]

    def body():
        if once[0]:
            once[0] = False
            if handed:
                assert ev.wait(WAIT), "never handed over"
            raise KeyboardInterrupt

    g = TaskGraph()
    g.add(body, name="body", out="a")
    g.add(noop, name="after", in_="a")
    g.add(ev.set, name="setter")
    with pytest.raises(KeyboardInterrupt):
        g.run(workers=2)
    states = {t.name: t.state for t in g.tasks}
    assert states["body"] == "failed" and states["after"] == "cancelled"
    assert not [s for s in states.values() if s in LIVE]
    assert g._run is None and not workers_alive(g)
    r = g.run(workers=2)  # the graph runs again
    assert set(r.states) == {"done"}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_body_adds_children_after_the_helper_handed_over(workers, monkeypatch):
    # (workers=1: no helper; the body's add hands over itself)
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)
    ev = threading.Event()
    out: list[int] = []
    lock = threading.Lock()

    def put(i):
        with lock:
            out.append(i)

    g = TaskGraph()

    def parent():
        if workers > 1:
            look_now(g)  # "parent" in hand: the helper takes over, runs "setter"
            assert ev.wait(WAIT), "never handed over"
        for i in range(5):
            g.add(put, i, name=f"child{i}", inout="c")
        g.taskwait()
        put(99)

    g.add(noop, name="a")
    g.add(parent, name="parent", out="p")
    g.add(noop, name="after_parent", in_="p")
    g.add(ev.set, name="setter")
    for _ in range(2):  # children are not recorded: the second run probes again
        out.clear()
        ev.clear()
        r = g.run(workers=workers, inline_below=1e-9)
        assert out == [0, 1, 2, 3, 4, 99]
        assert set(r.states) == {"done"} and len(r) == 4 + 5
        assert r["parent"].worker == 0
        assert r["after_parent"].start >= r["parent"].end
        assert g._grain is None and g._run is None and not workers_alive(g)


@pytest.mark.parametrize("seed", range(8))
def test_forward_after_names_with_a_hand_over(seed):
    # edges by after= names that point forward in the add order: graph.order is a
    # toposort, not the add order; a waiter (set by a later independent task) forces
    # the hand-over at a random place of that order
    rng = random.Random(seed)
    workers = rng.randint(1, 4)
    n = rng.randint(20, 120)
    rank = list(range(n))
    rng.shuffle(rank)  # task i's place in a hidden topological order
    by_rank = sorted(range(n), key=rank.__getitem__)
    log: list[int] = []
    lock = threading.Lock()
    ev = threading.Event()
    waiter = rng.randrange(n) if workers > 1 else -1
    preds: dict[int, list[int]] = {}
    g = TaskGraph()
    for i in range(n):
        earlier = by_rank[: rank[i]]
        p = rng.sample(earlier, k=min(len(earlier), rng.randint(0, 3)))
        preds[i] = p

        def do(i=i):
            if i == waiter:
                assert ev.wait(WAIT), "never handed over"
            with lock:
                log.append(i)

        g.add(do, name=f"t{i}", after=[f"t{j}" for j in p])
    g.add(ev.set, name="setter")
    r = g.run(workers=workers)
    assert_ran_in_order(log, preds, n, r)
    for i, p in preds.items():
        for j in p:
            assert r[f"t{j}"].end <= r[f"t{i}"].start
    assert not workers_alive(g)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1])
def test_graphs_of_zero_and_one_task(workers, n, tmp_path):
    g = TaskGraph()
    for i in range(n):
        g.add(noop, name=f"t{i}")
    for k in range(2):  # first run (probed), then a replay
        trace = tmp_path / f"run{k}.json"
        r = g.run(workers=workers, trace=trace)
        assert len(r) == n and list(r.states) == ["done"] * n
        assert json.loads(trace.read_text())["traceEvents"]
        assert g._run is None and not workers_alive(g)
    assert (g._grain is None) == (n == 0)


def test_the_trace_of_a_handed_over_run_has_every_task_once(tmp_path, monkeypatch):
    monkeypatch.setattr(inline, "PROBE_TICK", 60.0)
    ev = threading.Event()
    g = TaskGraph()

    def first():
        look_now(g)  # in hand, "a" done: the helper takes over
        assert ev.wait(WAIT), "never handed over"

    g.add(noop, name="a")
    g.add(first, name="first", out="a")
    for i in range(20):
        g.add(noop, name=f"t{i}", inout=("c", i % 3))
    g.add(ev.set, name="setter")
    g.add(noop, name="last", in_="a")
    path = tmp_path / "trace.json"
    r = g.run(workers=3, trace=path, inline_below=1e-9)
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in slices) == sorted(r.names)
    assert {e["tid"] for e in slices} <= {0, 1, 2}
    by_name = {e["name"]: e for e in slices}
    assert by_name["first"]["tid"] == 0 and by_name["setter"]["tid"] != 0


@pytest.mark.parametrize("seed", range(6))
def test_stress_hand_overs_at_natural_times(seed):
    # no forcing: tasks of random sizes (tiny, or a short GIL-free sleep) let the
    # helper take over wherever its tick falls; every task runs once, in order
    rng = random.Random(1000 + seed)
    for _ in range(5):
        workers = rng.randint(2, 4)
        n = rng.randint(30, 300)
        names = [f"v{i}" for i in range(rng.randint(2, 8))]
        runs = [0] * n
        log: list[int] = []
        lock = threading.Lock()
        g = TaskGraph()
        slow = set(rng.sample(range(n), k=rng.randint(0, 3)))
        for i in range(n):

            def do(i=i):
                if i in slow:
                    time.sleep(2e-3)
                with lock:
                    runs[i] += 1
                    log.append(i)

            g.add(
                do,
                name=f"t{i}",
                in_=rng.sample(names, k=rng.randint(0, 2)),
                out=rng.sample(names, k=rng.randint(0, 1)),
            )
        r = g.run(workers=workers)
        assert runs == [1] * n and set(r.states) == {"done"}
        pos = {t: k for k, t in enumerate(log)}
        for t in g.tasks:
            for s in t.succs:
                assert pos[t.index] < pos[s.index]
                assert r.ends[t.index] <= r.starts[s.index]
        assert not workers_alive(g)
