"""Analysis and static planning of a graph, without running it.

Nothing in this subpackage runs a graph, and the runtime uses none of it: the runtime
(:mod:`dagtrain.taskgraph.runtime`) schedules *dynamically*, taking ready tasks in the
order of keys that :meth:`TaskGraph.prepare <dagtrain.taskgraph.graph.TaskGraph.prepare>`
computes. What is here answers questions about a graph from its tasks' ``cost=``
estimates:

* :func:`upward_ranks`, :func:`critical_path`, :func:`lower_bound`: how long a run
  must take at least, and which chain of tasks decides it;
* :func:`plan_graph` (``TaskGraph.schedule``) and :mod:`.schedule` (``plan``,
  ``Problem``, ``Plan``): a *static* list schedule (HEFT, PEFT, ...) on heterogeneous
  processors with communication delays, for capacity planning and for comparison with
  other schedulers (``benchmarks/schedule_vs_saga.py``). A plan is never executed.

>>> from dagtrain.taskgraph import TaskGraph
>>> g = TaskGraph()
>>> _ = g.add(print, name="load", out="x", cost=2.0)
>>> _ = g.add(print, name="fwd", in_="x", out="y", cost=3.0)
>>> _ = g.add(print, name="metrics", in_="x", cost=1.0)
>>> path, length = critical_path(g)
>>> [t.name for t in path], length
(['load', 'fwd'], 5.0)
>>> lower_bound(g, workers=2)
5.0
>>> plan_graph(g, workers=2).makespan
5.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dagtrain.taskgraph.deps import upward_ranks_of

from .schedule import Plan, Problem, plan

if TYPE_CHECKING:
    from dagtrain.taskgraph.graph import TaskGraph
    from dagtrain.taskgraph.task import Task

__all__ = [
    "Plan",
    "Problem",
    "critical_path",
    "lower_bound",
    "plan",
    "plan_graph",
    "upward_ranks",
]


def _costs(graph: TaskGraph) -> list[float]:
    missing = [t.name for t in graph.tasks if t.cost is None]
    if missing:
        raise ValueError(
            f"task {missing[0]!r} has no cost= ({len(missing)} tasks lack one); "
            "analysis needs an estimated duration in seconds on every task"
        )
    return [float(t.cost) for t in graph.tasks]


def upward_ranks(graph: TaskGraph) -> list[float]:
    """rank[i] = cost of task i plus the costliest chain after it (by task index).

    The same ranks order the runtime's ready queue when every task has a cost; this
    function checks the costs first and names a task that lacks one.
    """
    costs = _costs(graph)
    return upward_ranks_of(costs, graph.topological_order())


def critical_path(graph: TaskGraph) -> tuple[list[Task], float]:
    """The costliest chain of dependent tasks, and its length (sum of costs)."""
    if not graph.tasks:
        return [], 0.0
    rank = upward_ranks(graph)
    t = max(graph.tasks, key=lambda x: (rank[x.index], -x.index))
    path = [t]
    while len(t):  # (a task is the list of its successors)
        t = max(t, key=lambda x: (rank[x.index], -x.index))
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

    A plan is an estimate from the tasks' costs: ``TaskGraph.run`` does not follow it.

    ``speeds``: per processor (default ``workers`` equal ones); ``data``: the data size of
    every edge, or a function of (pred, succ); ``bandwidth``: P x P link strengths.
    """
    costs = _costs(graph)
    graph.prepare()
    speeds = list(speeds) if speeds is not None else [1.0] * workers
    edges = [
        (t.index, s.index, data(t, s) if callable(data) else float(data))
        for t in graph.tasks
        for s in t  # (its successors)
    ]
    return plan(Problem(costs, edges, speeds, bandwidth), method=method)
