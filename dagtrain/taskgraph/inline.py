"""Inline runs: a plain graph of tiny tasks, run in the calling thread.

When a graph's tasks take less than ``inline_below`` on average, handing each to
another thread costs more than running it. Only plain graphs qualify (no values,
detach events, mutexes, priorities or costs that order the ready tasks), whose
semantics a serial run in a topological order keeps exactly: one clock read per task,
no lock, the same report and the same errors as a threaded run.

A replay knows its grain from the run before and runs inline when it is small. A first
run, whose grain nobody knows yet, *probes*: it starts inline too, while one helper
thread (the team's worker 1) looks at it every ``PROBE_TICK`` seconds. As soon as the
tasks so far took ``inline_below`` or more on average, or the task in hand has run for a
tick, the helper takes over every task not started, and the run goes on as a threaded
one (:class:`.runtime.Run`) with the tasks already done counted done. In either kind of
run, a task body that adds a task or waits (``add``, ``taskwait``, ``taskgroup``) hands
over the same way first, on its own thread, and then gets the running graph it asked
for. A first run of tiny tasks so costs what an inline replay does, plus a thread
start; one of long tasks loses at most a tick of the other workers' time (the helper
needs the interpreter lock to look: a pure-Python task holds it up to Python's switch
interval, 5 ms).

Hand-over. The calling thread takes tasks one by one from an iterator over the order,
the helper (under the run's lock) every task left at once, ``list(iterator)``: with the
GIL both are single C calls that no other thread interleaves with, so each task is
taken once and the caller's are a prefix of the order (a Python without the GIL runs
every first run on the team from the start). Of the caller's tasks, those whose end it
had recorded when the helper looked are done at once; the one in hand, if any, the
caller retires under the lock when it returns, and then joins the team as worker 0. An
exception outside a task body (an interrupt) stops the team and joins it before it
propagates.
"""

from __future__ import annotations

import sys
import threading
from operator import length_hint
from time import perf_counter
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .report import RunReport
from .task import CANCELLED, DONE, FAILED, LIVE, PENDING, RUNNING, Task

if TYPE_CHECKING:
    from .graph import TaskGraph
    from .runtime import Run

__all__ = ["GIL", "PROBE_TICK", "Probe", "run_inline", "take_over"]

# How often a probing first run is looked at, and how long one task may run inline
# before the others are handed to the team (seconds).
PROBE_TICK = 1e-3

# The hand-over relies on the GIL (see above); a free-threaded Python never probes.
GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


class Probe:
    """What the calling thread and the helper share while a run is inline."""

    __slots__ = (
        "caller",
        "ends",
        "handed",
        "inline_below",
        "left",
        "order",
        "over",
        "t0",
        "watched",
    )

    def __init__(self, order: list[Task], inline_below: float, watched: bool) -> None:
        self.order = order
        self.left = iter(order)  # tasks nobody took yet (next() and list() are atomic)
        self.ends: list[float] = []  # perf_counter() at the end of each inline task
        self.inline_below = inline_below
        self.watched = watched  # a helper looks (a first run): it is worker 1
        self.caller = threading.get_ident()
        self.t0 = 0.0  # set once the helper started: it does not look before
        self.handed = -1  # after a hand-over: order[:handed] were counted done
        self.over = False  # the caller finished inline: the helper leaves


def run_inline(run: Run, inline_below: float, probe: bool) -> RunReport:
    """Run a new run's prepared plain graph inline in the calling thread, in a
    topological order, handing it to the team when a body adds or waits (the graph
    holds the run meanwhile, so that a body's add/taskwait/taskgroup finds it), or,
    with ``probe`` (a first run), when the helper sees bigger tasks (see the module
    docstring). Same report, same errors as a threaded run."""
    graph, workers, trace = run.graph, run.workers, run.trace
    order = graph.order if graph.order is not None else graph.tasks
    pr = run.probe = Probe(order, inline_below, probe and workers > 1)
    try:
        if pr.watched:
            helper = threading.Thread(
                target=_watch, args=(run, pr), daemon=True, name=f"{graph.name}-worker-1"
            )
            run.threads.append(helper)
            helper.start()
        pr.t0 = run.t0 = perf_counter()  # after the start: not a task's time
        ends = pr.ends
        mark = ends.append
        perf = perf_counter
        failed: tuple[Task, BaseException, float] | None = None
        for task in pr.left:  # (ends early when the helper took what was left)
            try:
                kw = task.kwargs
                task.fn(*task.args, **kw) if kw else task.fn(*task.args)
            except BaseException as e:
                failed = (task, e, perf())
                break
            mark(perf())
        with run.lock:
            handed = pr.handed >= 0
            pr.over = True
            run.cond.notify_all()
        if not handed:
            for th in run.threads:
                th.join()
        else:
            _retire_inline(run, pr, failed)
    except BaseException:  # outside a task body (an interrupt): stop, join, raise
        _abandon(run, pr)
        raise
    if not handed:
        if failed is not None:
            mark(failed[2])
        return _inline_report(
            graph,
            order,
            workers,
            trace,
            pr.t0,
            ends,
            perf(),
            None if failed is None else (failed[0], failed[1]),
        )
    return run.finish(None)


def _retire_inline(run: Run, pr: Probe, failed: tuple[Task, BaseException, float] | None) -> None:
    """After a hand-over: retire the caller's tasks the helper left to it (the one that
    was in hand), under the lock; the caller then joins the team as worker 0."""
    order, ends = pr.order, pr.ends
    with run.lock:
        first = pr.handed
        start = ends[first - 1] if first else pr.t0
        for k in range(first, len(ends)):
            t = order[k]
            t.t0, t.t1, t.worker = start, ends[k], 0
            start = ends[k]
            x = t.x
            if x is None:
                run.complete(t)
            else:  # its body added tasks
                run.retire(t, x, None)
        if failed is not None:
            t, exc, t1 = failed
            t.t0, t.t1, t.worker = start, t1, 0
            run.fail(t, exc)
        run.current[0] = None
        if run.idle:
            run.cond.notify_all()


def _abandon(run: Run, pr: Probe) -> None:
    """An exception outside a task body: no task starts any more; join the threads (the
    tasks running finish first); what did not run is cancelled."""
    with run.lock:
        pr.over = True
        handed = pr.handed >= 0
        run.stopping = run.closing = True
        run.cond.notify_all()
    for th in run.threads:
        th.join()
    if handed:
        for t in run.tasks:
            if t.run_state in LIVE:
                t.run_state = CANCELLED
    else:
        done = len(pr.ends)
        for k, t in enumerate(pr.order):
            t.run_state = DONE if k < done else CANCELLED


def _watch(run: Run, pr: Probe) -> None:
    """The helper of a probing run: look every tick; hand over when the tasks are not
    tiny; then work as the team's worker 1."""
    ends = pr.ends
    total = len(pr.order)
    with run.lock:
        while not pr.over and pr.handed < 0:
            run.cond.wait(PROBE_TICK)
            tick = PROBE_TICK
            if pr.over or pr.handed >= 0:
                break
            t0 = pr.t0
            if not t0:
                continue  # the caller has not started yet
            now = perf_counter()
            n = len(ends)
            if n:
                big = now - ends[-1] >= tick or now - t0 >= n * pr.inline_below
            else:  # the first task: in hand for a tick (if the caller has taken it)
                big = now - t0 >= tick and length_hint(pr.left) < total
            if big:
                take_over(run, pr)
        handed = pr.handed >= 0
    if handed:
        run.serve(1)


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


def take_over(run: Run, probe: Probe) -> None:
    """Hand an inline run to the team (the run's lock held; idempotent): take every
    task nobody started, count the caller's finished ones done, mark the one in its
    hand running, ready the rest that can go, start the other workers (the helper, if
    any, is worker 1)."""
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
        for s in t:  # (its successors)
            s.npred_left -= 1
    for k in range(done, claimed):
        order[k].run_state = RUNNING  # in the caller's hand
    run.current[0] = order[claimed - 1] if claimed > done else None
    run.wid_of[probe.caller] = 0
    for k in range(claimed, len(order)):
        t = order[k]
        if not t.npred_left:
            run.make_ready(t)
    run.outstanding = len(tasks) - done
    for wid in range(2 if probe.watched else 1, run.workers):
        th = threading.Thread(
            target=run.serve, args=(wid,), daemon=True, name=f"{run.graph.name}-worker-{wid}"
        )
        run.threads.append(th)
        th.start()
    run.probe = None  # last: a body that saw the probe waits for this lock, then finds it
    run.cond.notify_all()
