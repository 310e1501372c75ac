"""Tasks added and waits made while a graph runs (OpenMP's tasks inside tasks).

:class:`Nesting` is the part of a :class:`~.runtime.Run` that serves the thread that
started the graph and the task bodies: ``add`` wires a task into the running graph (a
body's children get their own scope, index space and ancestors' ``below`` lists, see
:mod:`.runtime`'s "Task scheduling constraint"), ``taskwait`` and a ``taskgroup``'s
exit wait for what they name, running ready tasks meanwhile through the run's loops
(``_work`` at top level, ``_work_within`` in a body). A wait in a body that the run
stops with no task failed (join's deadline, an interrupt) raises :class:`Unwind`,
which cancels the body instead of failing it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from .deps import build_task, wait_targets
from .errors import TaskError
from .task import DONE, Task

if TYPE_CHECKING:
    from collections.abc import Callable

    from .graph import TaskGraph

__all__ = ["Group", "Nesting", "Unwind"]

_CHILD_BASE = 1 << 40  # index space of tasks spawned inside task bodies


class Unwind(Exception):
    """Raised from a wait in a task body when the run stops (timeout, interrupt) with no
    task failed: it unwinds the body, which is then cancelled, not failed."""


class Group:
    """A taskgroup: counts its tasks and their descendants not yet done."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = 0


class Nesting:
    """Adds and waits while the graph runs; mixed into :class:`~.runtime.Run`, whose
    state (lock, ``current``, ``below``, ...) and loops it uses."""

    # (the Run's state this part reads and writes; see .runtime)
    graph: TaskGraph
    lock: threading.Lock
    cond: threading.Condition
    heap: bool
    current: list[Task | None]
    wid_of: dict[int, int]
    main_groups: list[Group]
    children: dict[Task, list[Task]]
    below: dict[Task, Any]
    nchild: int
    evtasks: list[Task]
    tasks: list[Task]
    outstanding: int
    idle: int
    watchers: int
    stopping: bool
    error: tuple[Task, BaseException] | None

    def make_ready(self, t: Task) -> None:  # (the Run's)
        raise NotImplementedError

    def _work(self, wid: int, until: Callable[[], bool] | None, deadline: float | None) -> None:
        raise NotImplementedError

    def _work_within(self, wid: int, parent: Task, until: Callable[[], bool]) -> None:
        raise NotImplementedError

    def _wid(self, what: str) -> int:
        wid = self.wid_of.get(threading.get_ident())
        if wid is None:
            raise RuntimeError(
                f"{what}() while the graph runs must be called from the thread "
                "that started it or from a task body"
            )
        return wid

    def add(self, graph: TaskGraph, spec: tuple) -> Task:
        """``TaskGraph.add`` while the graph runs: wire, link, and ready it if it can go."""
        parent = self.current[self._wid("add")]
        with self.lock:
            if parent is None:
                scope = graph.scope
                index = len(graph.tasks)
                siblings = graph.tasks
            else:
                if parent.scope is None:
                    parent.scope = {}
                    self.below[parent] = [] if self.heap else deque()
                scope = parent.scope
                index = _CHILD_BASE + self.nchild
                self.nchild += 1
                siblings = self.children_of(parent)
            task, deps, _ = build_task(graph.slots, parent, scope, index, spec, siblings)
            npred = 0
            for p in deps:
                p.append(task)  # (a successor of p)
                if p.run_state != DONE:
                    npred += 1
            task.npred_left = npred
            task.key = -task.priority
            if task.event is not None:
                task.event.arm(self)
                self.evtasks.append(task)
            stack = self.main_groups if parent is None else parent.gstack
            inherited = None if parent is None else parent.groups
            if stack or inherited:
                task.groups = (*(inherited or ()), *(stack or ()))
                for g in task.groups:
                    g.pending += 1
            if parent is None:
                graph.tasks.append(task)  # TaskGraph.add then marks it unprepared
            else:
                self.children.setdefault(parent, []).append(task)
            self.tasks.append(task)
            self.outstanding += 1
            if not npred:
                self.make_ready(task)
                if self.idle:  # a waiting thread may not start it: then wake them all
                    self.cond.notify_all() if self.watchers else self.cond.notify()
        return task

    def children_of(self, parent: Task) -> list[Task]:
        return self.children.get(parent, [])

    def taskwait(self, clauses: tuple | None) -> None:
        """Wait for the earlier siblings (all, or those ``clauses`` name: see
        :func:`~.deps.wait_targets`), running ready tasks meanwhile."""
        wid = self._wid("taskwait")
        parent = self.current[wid]
        with self.lock:
            if clauses is None:
                siblings = self.graph.tasks if parent is None else self.children_of(parent)
                targets = [t for t in siblings if t.run_state != DONE]
            else:
                scope = self.graph.scope if parent is None else (parent.scope or {})
                targets = [t for t in wait_targets(scope, clauses) if t.run_state != DONE]
        self._wait(wid, _all_in(targets))

    def open_group(self) -> tuple[Group, list[Group], int]:
        wid = self._wid("taskgroup")
        parent = self.current[wid]
        group = Group()
        if parent is None:
            stack = self.main_groups
        else:
            if parent.gstack is None:
                parent.gstack = []
            stack = parent.gstack
        stack.append(group)
        return group, stack, wid

    def close_group(self, token: tuple[Group, list[Group], int]) -> None:
        group, stack, wid = token
        stack.remove(group)
        self._wait(wid, lambda: group.pending == 0)

    def _wait(self, wid: int, until: Callable[[], bool]) -> None:
        parent = self.current[wid]
        if parent is None:
            self._work(wid, until, None)
        else:
            self._work_within(wid, parent, until)
        if self.stopping:
            if self.error is not None:
                task, exc = self.error
                raise TaskError(task.name, exc) from exc
            if parent is not None:  # timeout or interrupt: unwind the body
                raise Unwind(f"the run of graph {self.graph.name!r} is stopping")


def _all_in(targets: list[Task]) -> Callable[[], bool]:
    def done() -> bool:
        while targets and targets[-1].run_state == DONE:
            targets.pop()
        return not targets

    return done
