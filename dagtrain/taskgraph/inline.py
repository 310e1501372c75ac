"""Inline runs: a plain graph of tiny tasks, run in the calling thread.

When a graph's tasks take less than ``inline_below`` on average, handing each to
another thread costs more than running it. Only plain graphs qualify (no values,
detach events or mutexes), whose semantics a serial run in a topological order keeps
exactly: one clock read per task, no lock, the same report and the same errors as a
threaded run.

``run_inline`` replays a graph whose previous run measured its grain. ``run_probed``
is a first run, whose grain nobody knows yet: it starts inline too, while one helper
thread (the team's worker 1) looks at it every ``PROBE_TICK`` seconds. As soon as the
tasks so far took ``inline_below`` or more on average, or the task in hand has run for
a tick, the helper takes over every task not started, and the run goes on as a
threaded one (:class:`.runtime.Run`) with the tasks already done counted done. A task
body that adds a task or waits (``add``, ``taskwait``, ``taskgroup``) hands over the
same way first, on its own thread, and then gets the running graph it asked for. A
first run of tiny tasks so costs what an inline replay does; one of long tasks loses at
most a tick of the other workers' time.

Hand-over. The calling thread takes tasks one by one from an iterator over the order,
the helper (under the run's lock) every task left at once, ``list(iterator)``: both
are single C calls that hold the GIL throughout, so each task is taken once and the
caller's are a prefix of the order. Of these, those whose end the caller
had recorded when the helper looked are done at once; the one in hand, if any, the
caller retires under the lock when it returns, and then joins the team as worker 0.
"""

from __future__ import annotations

import threading
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .report import RunReport
from .task import CANCELLED, DONE, FAILED, PENDING, RUNNING, Task

if TYPE_CHECKING:
    from .graph import TaskGraph
    from .runtime import Run

__all__ = ["PROBE_TICK", "Probe", "run_inline", "run_probed", "take_over"]

# How often a probing first run is looked at, and how long one task may run inline
# before the others are handed to the team (seconds).
PROBE_TICK = 1e-3


def run_inline(graph: TaskGraph, workers: int, trace: Any) -> RunReport:
    """Run a prepared plain graph (no values, events, mutexes) in the calling thread, in
    a topological order: the serial elision of a graph whose tasks are too small to
    gain from other threads. Same report, same errors as a threaded run."""
    order = graph.order if graph.order is not None else graph.tasks
    perf = perf_counter
    ends: list[float] = []
    mark = ends.append
    t0 = perf()
    failed: tuple[Task, BaseException] | None = None
    try:
        for task in order:
            kw = task.kwargs
            task.fn(*task.args, **kw) if kw else task.fn(*task.args)
            mark(perf())
    except BaseException as e:
        failed = (order[len(ends)], e)
        mark(perf())
    return _inline_report(graph, order, workers, trace, t0, ends, perf(), failed)


def _inline_report(
    graph: TaskGraph,
    order: list[Task],
    workers: int,
    trace: Any,
    t0: float,
    ends: list[float],
    end: float,
    failed: tuple[Task, BaseException] | None,
) -> RunReport:
    """The report (and trace) of an inline run in which ``order[:len(ends)]`` ran (the
    last of them failing, if ``failed``); raise the failure's TaskError."""
    ran = len(ends)
    if ran == len(order) and order is graph.tasks and failed is None:  # in list ops
        for task in order:
            task.run_state = DONE
        rel = [e - t0 for e in ends]
        n = len(rel)
        report = RunReport(
            graph.task_names,
            [0.0, *rel[:-1]] if n else [],
            rel,
            [0] * n,
            ["done"] * n,
            workers,
            end - t0,
            {},
        )
    else:
        start = t0
        for k, task in enumerate(order):
            if k < ran:
                task.t0, task.t1, task.worker = start, ends[k], 0
                task.run_state = DONE
                start = ends[k]
            else:
                task.worker = -1
                task.run_state = CANCELLED
        if failed is not None:
            failed[0].run_state = FAILED
        report = RunReport.from_tasks(graph.tasks, t0, end, workers, {})
    if trace is not None:
        from .trace import write_trace

        write_trace(trace, report, graph.tasks)
    if failed is not None:
        task, exc = failed
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise TaskError(task.name, exc) from exc
    return report


class Probe:
    """What the calling thread and the helper share while a first run runs inline."""

    __slots__ = ("caller", "ends", "handed", "inline_below", "left", "order", "over", "t0")

    def __init__(self, order: list[Task], inline_below: float) -> None:
        self.order = order
        self.left = iter(order)  # tasks nobody took yet (next() and list() are atomic)
        self.ends: list[float] = []  # perf_counter() at the end of each inline task
        self.inline_below = inline_below
        self.caller = threading.get_ident()
        self.t0 = 0.0
        self.handed = -1  # after a hand-over: order[:handed] were counted done
        self.over = False  # the caller finished inline: the helper leaves


def run_probed(graph: TaskGraph, workers: int, trace: Any, inline_below: float) -> RunReport:
    """The first run of a prepared plain graph: inline until it is seen to need the team
    (see the module docstring)."""
    from .runtime import Run

    order = graph.order if graph.order is not None else graph.tasks
    run = Run(graph, workers, trace, incremental=False)
    probe = run.probe = Probe(order, inline_below)
    graph._run = run  # a body's add/taskwait/taskgroup finds it, and hands over
    try:
        if workers > 1:
            helper = threading.Thread(
                target=_watch, args=(run, probe), daemon=True, name=f"{graph.name}-worker-1"
            )
            run.threads.append(helper)
            helper.start()  # (it first looks a tick from now: t0 is set by then)
        probe.t0 = run.t0 = perf_counter()  # after the start: not a task's time
        ends = probe.ends
        mark = ends.append
        perf = perf_counter
        failed: tuple[Task, BaseException, float] | None = None
        for task in probe.left:  # (ends when the helper took what was left)
            try:
                kw = task.kwargs
                task.fn(*task.args, **kw) if kw else task.fn(*task.args)
            except BaseException as e:
                failed = (task, e, perf())
                break
            mark(perf())
        with run.lock:
            handed = probe.handed >= 0
            probe.over = True
            run.cond.notify_all()
        if not handed:
            for th in run.threads:
                th.join()
            if failed is not None:
                mark(failed[2])
            return _inline_report(
                graph,
                order,
                workers,
                trace,
                probe.t0,
                ends,
                perf(),
                None if failed is None else (failed[0], failed[1]),
            )
        with run.lock:  # retire the tasks the helper left to this thread, join the team
            first = probe.handed
            start = ends[first - 1] if first else probe.t0
            for k in range(first, len(ends)):
                t = order[k]
                t.t0, t.t1, t.worker = start, ends[k], 0
                start = ends[k]
                x = t.x
                if x is None:
                    run._complete(t)
                else:  # its body added tasks
                    run._retire(t, x, None)
            if failed is not None:
                t, exc, t1 = failed
                t.t0, t.t1, t.worker = start, t1, 0
                run._fail(t, exc)
            run.current[0] = None
            if run.idle:
                run.cond.notify_all()
        return run.finish(None)
    finally:
        graph._run = None


def _watch(run: Run, probe: Probe) -> None:
    """The helper of a probing run: look every tick; hand over when the tasks are not
    tiny; then work as the team's worker 1."""
    ends = probe.ends
    tick = PROBE_TICK
    with run.lock:
        while not probe.over and probe.handed < 0:
            run.cond.wait(tick)
            if probe.over or probe.handed >= 0:
                break
            now = perf_counter()
            n = len(ends)
            last = ends[-1] if n else probe.t0
            if now - last >= tick or now - probe.t0 >= n * probe.inline_below:
                take_over(run, probe)
        handed = probe.handed >= 0
    if handed:
        run._helper(1)


def take_over(run: Run, probe: Probe) -> None:
    """Hand a probing run to the team (the run's lock held; idempotent): take every
    task nobody started, count the caller's finished ones done, mark the one in its
    hand running, ready the rest that can go, start workers 2.. (the helper is 1)."""
    if probe.handed >= 0 or probe.over:
        return
    # every task left, in one C call that no other thread can interleave with (the
    # GIL is not released inside it): the caller's next task, if any, is the helper's
    rest = list(probe.left)
    order = probe.order
    ends = probe.ends
    claimed = len(order) - len(rest)
    done = len(ends)  # read after the queue is empty: nothing past `claimed` is ended
    probe.handed = done
    run.probe = None
    tasks = run.tasks
    for t in tasks:
        t.npred_left = t.npred
        t.worker = -1
        t.run_state = PENDING
    start = probe.t0
    for k in range(done):
        t = order[k]
        t.t0, t.t1, t.worker = start, ends[k], 0
        start = ends[k]
        t.run_state = DONE
        for s in t.succs:
            s.npred_left -= 1
    for k in range(done, claimed):
        order[k].run_state = RUNNING  # in the caller's hand
    run.current[0] = order[claimed - 1] if claimed > done else None
    run.wid_of[probe.caller] = 0
    for k in range(claimed, len(order)):
        t = order[k]
        if not t.npred_left:
            run._make_ready(t)
    run.outstanding = len(tasks) - done
    for wid in range(2, run.workers):
        th = threading.Thread(
            target=run._helper, args=(wid,), daemon=True, name=f"{run.graph.name}-worker-{wid}"
        )
        run.threads.append(th)
        th.start()
    run.cond.notify_all()
