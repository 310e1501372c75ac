"""Analysis of a graph without running it: ranks, critical path, bounds, static plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .schedule import Plan, Problem, plan

if TYPE_CHECKING:
    from .graph import TaskGraph
    from .task import Task

__all__ = ["critical_path", "lower_bound", "plan_graph", "upward_ranks"]


def _costs(graph: TaskGraph) -> list[float]:
    missing = [t.name for t in graph.tasks if t.cost is None]
    if missing:
        raise ValueError(
            f"task {missing[0]!r} has no cost= ({len(missing)} tasks lack one); "
            "analysis needs an estimated duration in seconds on every task"
        )
    return [float(t.cost) for t in graph.tasks]


def upward_ranks(graph: TaskGraph) -> list[float]:
    """rank[i] = cost of task i plus the costliest chain after it (by task index)."""
    costs = _costs(graph)
    rank = [0.0] * len(costs)
    for t in reversed(graph.topological_order()):
        rank[t.index] = costs[t.index] + max((rank[s.index] for s in t.succs), default=0.0)
    return rank


def critical_path(graph: TaskGraph) -> tuple[list[Task], float]:
    """The costliest chain of dependent tasks, and its length (sum of costs)."""
    if not graph.tasks:
        return [], 0.0
    rank = upward_ranks(graph)
    t = max(graph.tasks, key=lambda x: (rank[x.index], -x.index))
    path = [t]
    while t.succs:
        t = max(t.succs, key=lambda x: (rank[x.index], -x.index))
        path.append(t)
    return path, rank[path[0].index]


def lower_bound(graph: TaskGraph, workers: int) -> float:
    """max(critical path, total cost / workers): no schedule on ``workers`` can beat it."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, not {workers}")
    _, cp = critical_path(graph)
    return max(cp, sum(_costs(graph)) / workers)


def plan_graph(
    graph: TaskGraph,
    workers: int = 2,
    *,
    speeds: Sequence[float] | None = None,
    bandwidth: Sequence[Sequence[float]] | None = None,
    data: float | Callable[[Task, Task], float] = 0.0,
    method: str = "best",
) -> Plan:
    """A static schedule of the graph (see :mod:`.schedule`); ``plan.proc[i]`` is task i's.

    ``speeds``: per processor (default ``workers`` equal ones); ``data``: the data size of
    every edge, or a function of (pred, succ); ``bandwidth``: P x P link strengths.
    """
    costs = _costs(graph)
    graph.prepare()
    speeds = list(speeds) if speeds is not None else [1.0] * workers
    edges = [
        (t.index, s.index, data(t, s) if callable(data) else float(data))
        for t in graph.tasks
        for s in t.succs
    ]
    return plan(Problem(costs, edges, speeds, bandwidth), method=method)


__all__ += ["Plan"]
