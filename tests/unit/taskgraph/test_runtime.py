"""Running graphs: order, failures, detach events, values and their release, replays."""

from __future__ import annotations

import _thread
import gc
import json
import signal
import threading
import time
import tracemalloc

import pytest

from dagtrain.taskgraph import (
    Event,
    Outputs,
    Ref,
    TaskError,
    TaskGraph,
    TaskTimeoutError,
)


def noop(*args, **kwargs):
    return None


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_chain_runs_in_order_and_replays(workers):
    log = []
    g = TaskGraph()
    for i in range(20):
        g.add(log.append, i, name=f"t{i}", inout="x")
    g.run(workers=workers)
    assert log == list(range(20))
    g.run(workers=workers)  # a replay runs the same graph again
    assert log == list(range(20)) * 2


def test_report_has_every_task_with_times_and_workers():
    g = TaskGraph()
    for i in range(8):
        g.add(time.sleep, 0.01, name=f"s{i}")
    r = g.run(workers=2)
    assert len(r) == 8 and r.workers == 2
    for rec in r:
        assert 0 <= rec.start <= rec.end <= r.makespan
        assert rec.worker in (0, 1) and rec.state == "done"
    assert {rec.worker for rec in r} == {0, 1}  # sleeping releases the GIL: both worked
    assert 0 < r.utilisation <= 1.0
    assert r["s3"].duration >= 0.01


def test_failure_raises_task_error_with_cause_and_cancels_dependents():
    started = []

    def boom():
        raise KeyError("broken batch")

    g = TaskGraph()
    g.add(boom, name="load", out="batch")
    g.add(started.append, "fwd", name="fwd", in_="batch", out="act")
    g.add(started.append, "bwd", name="bwd", in_="act")
    before = threading.active_count()
    with pytest.raises(TaskError, match="task 'load' failed: KeyError") as info:
        g.run(workers=3)
    err = info.value
    assert err.task == "load"
    assert isinstance(err.__cause__, KeyError)
    tb = err.__cause__.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "boom"  # the original traceback, intact
    assert started == []
    assert [t.state for t in g.tasks] == ["failed", "cancelled", "cancelled"]
    assert threading.active_count() == before  # no thread left behind
    # a second run works (and fails the same way): the graph was not corrupted
    with pytest.raises(TaskError):
        g.run(workers=3)


def test_running_tasks_finish_when_another_fails():
    finished = []

    def slow():
        time.sleep(0.1)
        finished.append("slow")

    def fail():
        time.sleep(0.01)
        raise RuntimeError("x")

    g = TaskGraph()
    g.add(slow, name="slow")
    g.add(fail, name="fail")
    g.add(finished.append, "late", name="late", after=["fail"])
    with pytest.raises(TaskError, match="'fail'"):
        g.run(workers=2)
    assert finished == ["slow"]


def test_second_run_after_failure_succeeds_when_the_cause_is_gone():
    flaky = {"fail": True}

    def step():
        if flaky["fail"]:
            raise OSError("disk full")

    g = TaskGraph()
    g.add(step, name="ckpt", out="c")
    g.add(noop, name="after", in_="c")
    with pytest.raises(TaskError):
        g.run(workers=2)
    flaky["fail"] = False
    r = g.run(workers=2)
    assert [rec.state for rec in r] == ["done", "done"]


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt for the test's duration, as in an interactive
    Python. A process started in the background by a non-interactive shell (``make
    test &``, a CI runner) inherits SIGINT ignored, and Python then keeps it ignored:
    ``_thread.interrupt_main()`` does nothing at all, and a test that expects its
    KeyboardInterrupt sees none (this test's 'DID NOT RAISE' in a CI run)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_stops_the_run_promptly(sigint_raises):
    ran = []

    def interrupt_soon():
        threading.Timer(0.05, _thread.interrupt_main).start()
        time.sleep(0.01)

    g = TaskGraph()
    g.add(interrupt_soon, name="arm")
    for i in range(200):
        g.add(lambda i=i: (ran.append(i), time.sleep(0.01)), name=f"t{i}", inout="x")
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        g.run(workers=2)
    # the interrupt comes after ~5 of the 200 serial 10 ms tasks; counted, not timed
    assert len(ran) < 100
    time.sleep(0.1)  # the Timer thread ends
    assert threading.active_count() <= before


def test_detached_task_completes_when_its_event_is_fulfilled():
    ev = Event()
    order = []

    def start_async():
        order.append("started")
        threading.Timer(0.05, lambda: (order.append("fulfilled"), ev.fulfill())).start()

    g = TaskGraph()
    g.add(start_async, name="allreduce", out="grad", detach=ev)
    g.add(order.append, "update", name="update", in_="grad")
    g.run(workers=2)
    assert order == ["started", "fulfilled", "update"]
    order.clear()
    g.run(workers=2)  # the event is re-armed on replay
    assert order == ["started", "fulfilled", "update"]


def test_event_fulfilled_before_the_function_returns_or_even_starts():
    ev = Event()
    g = TaskGraph()
    g.add(ev.fulfill, name="hook", out="h")  # fires "early", from another task
    g.add(noop, name="bucket", detach=ev, in_="h", out="b")
    g.add(noop, name="update", in_="b")
    r = g.run(workers=2)
    assert all(rec.state == "done" for rec in r)


def test_detach_true_passes_the_event_and_fail_fails_the_task():
    def start(event):
        threading.Timer(0.01, event.fail, args=(ConnectionError("rank 1 gone"),)).start()

    g = TaskGraph()
    g.add(start, name="allreduce", detach=True, out="g")
    g.add(noop, name="update", in_="g")
    with pytest.raises(TaskError, match="allreduce") as info:
        g.run(workers=2)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert g.tasks[1].state == "cancelled"


def test_idle_settles_events_in_the_calling_thread_with_no_wait_in_between():
    """``idle`` runs in the calling thread only when it has nothing to start; a task it
    readies (by fulfilling an event) runs next, in that thread, without the run's
    condition being waited on; False lets the thread sleep until a task is ready."""
    main = threading.get_ident()
    pending: list[Event] = []
    order: list[str] = []
    calls: list[int] = []

    def post(name: str, ev: Event) -> None:
        order.append(f"post {name}")
        pending.append(ev)

    def idle() -> bool:
        calls.append(threading.get_ident())
        if not pending:
            return False
        order.append("idle")
        pending.pop(0).fulfill()
        return True

    g = TaskGraph()
    for k in range(2):
        ev = Event()
        g.add(post, f"recv{k}", ev, name=f"recv{k}", out=f"in{k}", detach=ev, priority=9 - k)
        g.add(order.append, f"F{k}", name=f"F{k}", in_=f"in{k}", priority=5 - k)
    late = Event()
    g.add(lambda: threading.Timer(0.05, late.fulfill).start(), name="late", detach=late)
    for _ in range(2):  # and on a replay
        order.clear()
        calls.clear()
        g.run(workers=1, idle=idle)
        assert order == ["post recv0", "post recv1", "idle", "F0", "idle", "F1"], order
        assert set(calls) == {main}
        assert len(calls) >= 3  # the last: nothing posted, so the thread slept for "late"


def _states_unless_asleep(g: TaskGraph, idle, why: str) -> list[str]:
    """Run ``g`` with ``idle`` in a thread of its own, with no run timeout (its timed
    wait would end a lost sleep and hide it); the tasks' states, or a failure saying
    ``why`` where the run still sleeps after 30 s."""
    reports: list = []
    runner = threading.Thread(target=lambda: reports.append(g.run(workers=1, idle=idle)))
    runner.daemon = True
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), why
    return [rec.state for rec in reports[0]]


def test_a_task_readied_while_idle_ran_is_not_missed():
    """An event settled by another thread while ``idle`` runs (the lock released, no
    thread waiting to be woken) and ``idle`` then says it did nothing: the thread looks
    again before it sleeps, so the task that became ready runs (it used to wait
    forever: a pipeline rank's check-finite, readied by its gradients' average)."""
    ev = Event()

    def idle() -> bool:
        t = threading.Thread(target=ev.fulfill)
        t.start()
        t.join()
        return False

    g = TaskGraph()
    g.add(noop, name="allreduce", detach=ev, out="g")
    g.add(noop, name="check", in_="g")
    why = "the ready task was missed: the run sleeps forever"
    assert _states_unless_asleep(g, idle, why) == ["done", "done"]


def test_idle_is_asked_again_after_a_task_readied_while_it_ran():
    """The task readied while ``idle`` ran posts what only ``idle`` settles: once it ran,
    ``idle`` is asked again (it used to be skipped until the thread had slept: forever)."""
    held, posted_ev = Event(), Event()
    posted: list[Event] = []
    calls: list[int] = []

    def idle() -> bool:
        calls.append(1)
        if len(calls) == 1:  # readies "post" from another thread, then has nothing
            t = threading.Thread(target=held.fulfill)
            t.start()
            t.join()
            return False
        if posted:
            posted.pop().fulfill()
            return True
        return False

    g = TaskGraph()
    g.add(noop, name="held", detach=held, out="h")
    g.add(posted.append, posted_ev, name="post", in_="h", out="p", detach=posted_ev)
    g.add(noop, name="end", in_="p")
    why = "idle was not asked again: the run sleeps forever"
    assert _states_unless_asleep(g, idle, why) == ["done"] * 3


def test_idle_needs_one_worker():
    g = TaskGraph()
    g.add(noop, name="a")
    with pytest.raises(ValueError, match="idle= needs workers=1, not 2"):
        g.run(workers=2, idle=lambda: False)


def test_an_event_failed_in_idle_fails_its_task():
    ev = Event()
    g = TaskGraph()
    g.add(noop, name="recv", detach=ev, out="x")
    g.add(noop, name="F", in_="x")
    with pytest.raises(TaskError, match="recv") as info:
        g.run(workers=1, idle=lambda: ev.fail(ConnectionError("rank 1 gone")) or True)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert g.tasks[1].state == "cancelled"


def test_timeout_names_the_task_waiting_for_its_event():
    g = TaskGraph()
    g.add(noop, name="never-fulfilled", detach=Event())
    with pytest.raises(TaskTimeoutError, match="never-fulfilled"):
        g.run(workers=2, timeout=0.2)


def test_mutexinoutset_never_overlaps_inoutset_does():
    def make(box, counter):
        def body():
            with box["lock"]:
                box["now"] += 1
                box["max"] = max(box["max"], box["now"])
            time.sleep(0.02)
            with box["lock"]:
                box["now"] -= 1
            counter.append(1)

        return body

    for clause, expect_overlap in (("mutexinoutset", False), ("inoutset", True)):
        box = {"lock": threading.Lock(), "now": 0, "max": 0}
        done = []
        g = TaskGraph()
        for _ in range(6):
            g.add(make(box, done), **{clause: "acc"})
        g.run(workers=4)
        assert len(done) == 6
        assert (box["max"] > 1) is expect_overlap, clause


def test_priority_orders_ready_tasks():
    log = []
    g = TaskGraph()
    for p in (1, 5, 3, 4, 2):
        g.add(log.append, p, priority=p)
    g.run(workers=1)
    assert log == [5, 4, 3, 2, 1]


def test_costs_put_the_critical_path_first():
    #   short (cost 1)    long1 (cost 5) -> long2 (cost 5)
    log = []
    g = TaskGraph()
    g.add(log.append, "short", cost=1)
    g.add(log.append, "long1", cost=5, out="l")
    g.add(log.append, "long2", cost=5, in_="l")
    g.run(workers=1)
    assert log[0] == "long1"


def test_values_flow_from_writers_to_readers():
    g = TaskGraph()
    g.add(lambda: 3, name="a", out="x")
    g.add(lambda: Outputs(y=10, z=20), name="b", out=("y", "z"))
    g.add(lambda x, y, z: x + y + z, Ref("x"), Ref("y"), z=Ref("z"), name="c", out="s")
    g.add(lambda s: s * 2, Ref("s"), name="d", inout="s")
    r = g.run(workers=2, keep=["s"])
    assert r.values == {"s": 66}


def test_inout_reader_sees_the_previous_version():
    g = TaskGraph()
    g.add(lambda: [1], name="init", out="v")
    for i in range(5):
        g.add(lambda v, i=i: [*v, i], Ref("v"), name=f"append{i}", inout="v")
    assert g.run(workers=3, keep="v").values["v"] == [1, 0, 1, 2, 3, 4]


def test_peak_memory_of_a_chain_is_about_two_intermediates():
    #   x0 -> x1 -> ... -> x29, each 4 MB; each reader drops its input when done
    size = 4 << 20
    g = TaskGraph()
    g.add(lambda: bytearray(size), name="x0", out="x0")
    for i in range(1, 30):
        g.add(lambda prev: bytearray(prev), Ref(f"x{i - 1}"), name=f"x{i}", out=f"x{i}")
    g.add(len, Ref("x29"), name="use")
    gc.collect()
    tracemalloc.start()
    try:
        g.run(workers=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * size, f"peak {peak / size:.1f} intermediates"
    assert peak > 1.5 * size  # a step holds its input and its output: the test measures


def test_values_without_readers_are_not_kept():
    import weakref

    class Big:
        pass

    refs = []

    def make():
        b = Big()
        refs.append(weakref.ref(b))
        return b

    g = TaskGraph()
    g.add(make, name="a", out="x")
    g.add(noop, Ref("x"), name="r")
    g.add(make, name="b", out="x")  # supersedes the first version; nobody reads it
    g.run(workers=2)
    gc.collect()
    assert refs[0]() is None  # read, then dropped once its reader finished
    assert refs[1]() is None  # never read: never kept


def test_trace_has_a_lane_per_worker_and_arrows(tmp_path):
    ev = threading.Event()  # "a" waits until "b" ran: they must be on two workers
    g = TaskGraph()
    g.add(lambda: ev.wait(30) or pytest.fail("b never ran"), name="a", out="x")
    g.add(ev.set, name="b", out="y")
    g.add(noop, name="c", in_=("x", "y"))
    path = tmp_path / "trace.json"
    g.run(workers=2, trace=str(path))
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in slices) == ["a", "b", "c"]
    assert {e["tid"] for e in slices} <= {0, 1}
    assert len({e["tid"] for e in slices if e["name"] in "ab"}) == 2
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == 2
    lanes = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(lanes) == 2


def test_task_bodies_spawn_children_and_taskwait_for_them():
    log = []
    g = TaskGraph()

    def parent():
        for i in range(4):
            g.add(log.append, i, name=f"child{i}", inout="c")
        g.taskwait()
        log.append("parent-after-wait")

    g.add(parent, name="parent", out="p")
    g.add(log.append, "next", name="next", in_="p")
    g.run(workers=2)
    assert log == [0, 1, 2, 3, "parent-after-wait", "next"]
    assert len(g) == 2  # children are made anew by each run, not recorded in the graph
    log.clear()
    g.run(workers=1)  # taskwait in the only worker: it runs the children itself
    assert log == [0, 1, 2, 3, "parent-after-wait", "next"]


def test_incremental_graph_with_taskwait_on_items_and_taskgroup():
    log = []
    g = TaskGraph()
    g.start(workers=2)
    g.add(lambda: (time.sleep(0.02), log.append("x")), name="wx", out="x")
    g.add(lambda: (time.sleep(0.2), log.append("slow")), name="slow", out="y")
    g.taskwait(on="x")
    log.append("after-x")

    def spawner():
        g.add(lambda: (time.sleep(0.02), log.append("grandchild")), name="gc")

    with g.taskgroup():
        g.add(spawner, name="spawner")
    log.append("after-group")
    report = g.join()
    assert log.index("x") < log.index("after-x")
    assert log.index("grandchild") < log.index("after-group")
    if report["slow"].worker != 0:
        # taskwait(on=x) did not wait for y; (the waiting thread may run ready tasks
        # itself, OpenMP's task scheduling point: if it took "slow", it finished it)
        assert log.index("after-x") < log.index("slow")
    assert len(g) == 3
    log.clear()
    g.run(workers=2)  # the incrementally built graph replays
    assert sorted(log) == ["grandchild", "slow", "x"]


def test_taskwait_outside_a_run_is_a_clear_error():
    with pytest.raises(RuntimeError, match="needs a running graph"):
        TaskGraph().taskwait()


def test_failure_in_a_child_surfaces_from_taskwait_and_run():
    g = TaskGraph()

    def parent():
        g.add(lambda: 1 / 0, name="bad-child")
        g.taskwait()

    g.add(parent, name="parent")
    with pytest.raises(TaskError, match="bad-child") as info:
        g.run(workers=2)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_workers_must_be_positive():
    g = TaskGraph()
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        g.run(workers=0)


def test_report_by_name_and_cycle_args_like_graphlib():
    from dagtrain.taskgraph import CycleError

    g = TaskGraph()
    g.add(noop, name="a")
    g.add(noop, name="b", after="a")
    r = g.run(workers=2)
    assert set(r.tasks) == {"a", "b"} and r.tasks["b"].start >= r.tasks["a"].end
    assert r.utilization == r.utilisation
    err = CycleError(["a", "b", "a"])
    assert err.args[1] == ["a", "b", "a"] and "a -> b -> a" in str(err)


def test_the_demo_step_runs_and_writes_its_trace(tmp_path, capsys):
    from dagtrain.taskgraph.__main__ import main

    trace = tmp_path / "step.json"
    main(["--steps", "2", "--scale", "0.05", "--trace", str(trace)])
    out = capsys.readouterr().out
    assert "critical path" in out and "faster" in out
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 16


def test_a_replay_of_tiny_tasks_runs_inline_in_program_order():
    log = []
    g = TaskGraph()
    for i in range(50):
        g.add(log.append, i, name=f"t{i}", out=i % 5, in_=(i - 1) % 5)
    # The first run measures the grain. These tasks take well under a microsecond when
    # the machine is quiet, but a loaded machine can deschedule the caller mid-probe and
    # hand the run to threads, whose grain is then a few microseconds: a threshold of a
    # millisecond keeps "tiny" true under any load without changing what is checked.
    g.run(workers=2, inline_below=1e-3)
    log.clear()
    r = g.run(workers=2, inline_below=1e-3)
    assert log == list(range(50))
    assert set(r.workers_of) == {0} and all(s == "done" for s in r.states)
    assert all(a <= b for a, b in zip(r.ends, r.ends[1:]))
    log.clear()
    r = g.run(workers=2, inline_below=0)  # opt out
    assert sorted(log) == list(range(50))


def test_an_inline_replay_fails_like_a_threaded_run():
    calls = {"n": 0}

    def sometimes():
        calls["n"] += 1
        if calls["n"] == 2:
            raise ValueError("second call")

    g = TaskGraph()
    g.add(noop, name="first", out="a")
    g.add(sometimes, name="flaky", in_="a", out="b")
    g.add(noop, name="last", in_="b")
    g.run(workers=2)
    with pytest.raises(TaskError, match="'flaky'") as info:
        g.run(workers=2)
    assert isinstance(info.value.__cause__, ValueError)
    assert [t.state for t in g.tasks] == ["done", "failed", "cancelled"]


def test_graphs_with_values_or_events_never_run_inline():
    g = TaskGraph()
    g.add(lambda: 1, name="a", out="x")
    g.add(noop, Ref("x"), name="b")
    g.run(workers=2)
    g.run(workers=2)
    assert not g._plain
