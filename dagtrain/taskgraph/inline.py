"""Inline replay: a plain graph of tiny tasks, run in the calling thread.

When a graph's tasks took less than ``inline_below`` on average in the previous run,
handing each to another thread costs more than running it. ``run_inline`` is the
serial elision of such a graph: program (topological) order, one clock read per
task, the same report and the same errors as a threaded run. Only plain graphs
qualify (no values, detach events or mutexes), whose semantics a serial order in a
topological order keeps exactly.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .report import RunReport
from .task import CANCELLED, DONE, FAILED, Task

if TYPE_CHECKING:
    from .graph import TaskGraph

__all__ = ["run_inline"]


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
    end = perf()
    ran = len(ends)
    if ran == len(order) and order is graph.tasks:  # the common case, in C-speed list ops
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
        report = RunReport.from_tasks(graph.tasks, t0, end, workers, {})
    if trace is not None:
        from .trace import write_trace

        write_trace(trace, report, graph.tasks)
    if failed is not None:
        task, exc = failed
        task.run_state = FAILED
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise TaskError(task.name, exc) from exc
    return report
