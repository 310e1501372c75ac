"""TaskGraph: tasks whose order is inferred from OpenMP 5.2 ``depend`` clauses.

``add`` appends a task and wires its dependences against the *earlier* tasks that
touched the same data items, in the order tasks were added (OpenMP's sibling-task
rule; :mod:`.deps` has the rules). ``after=`` adds control edges, to a Task or to a
name; names may refer to tasks added later, the only way to make a cycle, so
``prepare`` runs a topological sort only when such forward references exist.

Values: a task's return value is published under the items it writes (out/inout);
``Ref(item)`` arguments of later tasks receive it. A version's value is dropped as
soon as its last reader finished, unless ``run(keep=...)`` asked for it.

Running is in :mod:`.runtime` (and :mod:`.inline`); analysis (critical path, lower
bound, static schedules), which never runs anything, in the :mod:`.analysis`
subpackage.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .deps import (
    NO_CLAUSE,
    add_plain,
    build_task,
    find_cycle,
    items,
    key_of,
    upward_ranks_of,
)
from .errors import CycleError
from .inline import GIL
from .runtime import Run
from .task import OUT, Event, Item, Slot, Task

if TYPE_CHECKING:
    import os

    from .report import RunReport
    from .trace import TraceFile

__all__ = ["TaskGraph", "gc_paused"]

_NONE = (tuple, list, set, frozenset)  # an empty one of these names no item
_COST, _PRIORITY, _EXTRAS, _NAME = map(attrgetter, ("cost", "priority", "x", "name"))


class TaskGraph:
    """A graph of tasks with OpenMP-style data dependences; build once, run many times.

    >>> from dagtrain.taskgraph import Ref
    >>> g = TaskGraph()
    >>> a = g.add(lambda: 1, name="a", out="x")
    >>> b = g.add(lambda x: x + 1, Ref("x"), name="b", out="y")
    >>> g.run(workers=2, keep=["y"]).values["y"]
    2

    Not thread-safe while being built (build it from one thread); while it runs,
    ``add`` may be called from the thread that started it and from task bodies.

    ``name`` and ``tasks`` (in the order they were added) are for everyone. The other
    attributes without an underscore are state the graph shares with the runtime
    (:mod:`.deps`, :mod:`.runtime`, :mod:`.inline` read them; only the graph and
    ``build_task`` change them); do not set them:

    ==============  ==============================================================
    ``scope``       ``{item: Item}``: the dependence state of the top-level items
    ``slots``       the value versions of top-level items that someone reads or
                    keeps, reset by each run
    ``order``       after ``prepare``: the tasks in a topological order, or None when
                    the add order is one (no ``after=`` name points forward)
    ``heap``        after ``prepare``: the tasks' ready-queue keys differ, so the
                    runtime keeps ready tasks in a heap (else a FIFO)
    ``task_names``  after ``prepare``: every task's name, shared by the reports of
                    its replays
    ==============  ==============================================================
    """

    def __init__(self, name: str = "taskgraph") -> None:
        self.name = name
        self.tasks: list[Task] = []
        self.scope: dict[Hashable, Item] = {}
        self.slots: list[Slot] = []
        self.order: list[Task] | None = None
        self.heap = False
        self.task_names: list[str] = []
        self._after_names: list[tuple[Task, str]] = []
        self._forward = False  # an after= name may point forward: cycles possible
        self._prepared = False
        self._run: Run | None = None
        self._plain = False  # no task has values, an event, a mutex: inline replay is safe
        self._grain: float | None = None  # mean seconds per task in the last run

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __repr__(self) -> str:
        return f"<TaskGraph {self.name!r} with {len(self.tasks)} tasks>"

    # ------------------------------------------------------------------ building
    def add(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        name: str | None = None,
        in_: Any = NO_CLAUSE,
        out: Any = NO_CLAUSE,
        inout: Any = NO_CLAUSE,
        mutexinoutset: Any = NO_CLAUSE,
        inoutset: Any = NO_CLAUSE,
        after: Any = NO_CLAUSE,
        priority: float = 0,
        cost: float | None = None,
        detach: Event | bool | None = None,
        **kwargs: Any,
    ) -> Task:
        """Add a task calling ``fn(*args, **kwargs)``; return it.

        Each clause takes one item or a tuple/list/set of items; an item is any
        hashable (a name), or any other object, matched by identity. ``after`` takes
        tasks or task names (a name means every task of that name, and may name a
        task added later). ``priority``: larger runs first among ready tasks when not
        every task has a ``cost``; with costs on all tasks, the critical path decides.
        ``detach``: an :class:`Event` (or ``True`` to have one passed as
        ``event=``); the task then completes only when the event is fulfilled.

        Raises TypeError/ValueError naming the task for a bad argument.
        """
        if not callable(fn):
            raise TypeError(f"task {name or fn!r}: fn must be callable, not {type(fn).__name__}")
        if name is None:
            name = getattr(fn, "__name__", None) or type(fn).__name__
        if cost is not None and not cost >= 0:
            raise ValueError(f"task {name!r}: cost must be a number >= 0 (seconds), not {cost!r}")
        if (
            mutexinoutset is NO_CLAUSE
            and inoutset is NO_CLAUSE
            and after is NO_CLAUSE
            and detach is None
            and not kwargs
            and self._run is None
        ):
            # The common task of a build (most of a build's time is Python's per-call
            # and per-record overhead): made and wired in one call, or None for
            # build_task (a Ref argument, an unhashable item).
            tasks = self.tasks
            index = len(tasks)
            task = add_plain(self.scope, fn, args, name, priority, cost, index, in_, out, inout)
            if task is not None:
                tasks.append(task)
                self._prepared = False
                return task
        spec = (
            fn,
            args,
            kwargs,
            name,
            (in_, out, inout, mutexinoutset, inoutset),
            after,
            priority,
            cost,
            detach,
        )
        run = self._run
        if run is not None:
            if run.probe is not None:
                run.hand_over()
            task = run.add(self, spec)
            if task.parent is None:  # a top-level task: names, keys and plainness change
                self._prepared = False
            return task
        task, deps, later = build_task(self.slots, None, self.scope, len(self.tasks), spec, None)
        for p in deps:
            p.append(task)
        if later:
            self._after_names.extend((task, n) for n in later)
            self._forward = True
        self.tasks.append(task)
        self._prepared = False
        return task

    # ---------------------------------------------------------------- preparing
    def prepare(self) -> None:
        """Resolve ``after`` names and check for cycles; ``run`` calls it.

        Raises CycleError (a ValueError) carrying the cycle's task names, or
        ValueError for an ``after`` name that matches no task.
        """
        if self._prepared:
            return
        if self._after_names:
            index: dict[str, list[Task]] = {}
            for t in self.tasks:
                index.setdefault(t.name, []).append(t)
            for task, target in self._after_names:
                found = index.get(target)
                if not found:
                    raise ValueError(
                        f"task {task.name!r}: after={target!r} names no task of this graph"
                    )
                for p in found:
                    if task in p:  # (its successors)
                        continue
                    p.append(task)
                    task.npred += 1
            self._after_names.clear()
        self.order = self._toposort() if self._forward else None
        self._prepared = True
        self._set_keys()
        self._plain = not any(map(_EXTRAS, self.tasks))  # no task has extras
        self.task_names = list(map(_NAME, self.tasks))  # shared by the reports of its replays

    def _set_keys(self) -> None:
        """Ready-queue keys: minus the upward rank when every task has a cost, else
        minus ``priority``; a FIFO queue (cheaper, and the keys unused) when all keys
        are equal. (The passes over the tasks are map()s: C loops.)"""
        tasks = self.tasks
        if tasks and None not in map(_COST, tasks):
            costs = [float(t.cost) for t in tasks]
            ranks = upward_ranks_of(costs, self.order if self.order is not None else tasks)
            for t, r in zip(tasks, ranks):
                t.key = -r
            self.heap = len(set(ranks)) > 1
        elif len(set(map(_PRIORITY, tasks))) > 1:
            for t in tasks:
                t.key = -t.priority
            self.heap = True
        else:
            self.heap = False

    def _toposort(self) -> list[Task]:
        npred = [t.npred for t in self.tasks]
        queue = deque(t for t in self.tasks if not t.npred)
        order = []
        while queue:
            t = queue.popleft()
            order.append(t)
            for s in t:  # (its successors)
                npred[s.index] -= 1
                if not npred[s.index]:
                    queue.append(s)
        if len(order) != len(self.tasks):
            left = {t.index for t in self.tasks if npred[t.index]}
            raise CycleError(find_cycle(self.tasks, left))
        return order

    def topological_order(self) -> list[Task]:
        """The tasks in an order that respects every edge (the add order if it does)."""
        self.prepare()
        return list(self.order if self.order is not None else self.tasks)

    static_order = topological_order  # graphlib's name for it

    # ------------------------------------------------------------------ running
    def run(
        self,
        workers: int = 2,
        *,
        trace: str | os.PathLike | TraceFile | None = None,
        timeout: float | None = None,
        keep: Iterable[Hashable] = (),
        inline_below: float = 1e-6,
        idle: Callable[[], bool] | None = None,
    ) -> RunReport:
        """Run (or replay) every task; return a :class:`RunReport`.

        ``workers`` threads execute tasks, the calling thread being one of them.
        ``trace``: write a Chrome/Perfetto trace there (a path, or a :class:`TraceFile`
        that also names the process). ``timeout``: seconds, after which
        ``TaskTimeoutError`` names the unfinished tasks. ``keep``: items whose final
        value ``RunReport.values`` returns.

        ``inline_below`` (seconds; 0: never inline): a graph with no values, events,
        mutexes, priorities or costs whose tasks take less than this on average runs
        them in a topological order in the calling thread, since handing such a task to
        another thread costs more than running it. A replay knows the grain from the
        run before; a first run starts inline and hands the tasks not started to the
        team as soon as they prove bigger (within a millisecond, or at once when a task
        body adds tasks or waits: see :mod:`.inline`). Not with ``timeout``, ``keep`` or
        ``idle``.

        ``idle`` (``workers=1`` only): called in the calling thread, with no lock held,
        whenever that thread has no ready task to start, before it sleeps. It may block
        to settle a detached task's event itself (``fulfill``/``fail``), which saves
        the wake-up of the thread that would otherwise settle it and then wake this
        one; it returns whether it did anything (True: look for ready tasks again at
        once; False: sleep until a task is ready). It must return within a deadline of
        its own, and while it blocks, tasks that become ready wait for it, and so does
        a failure's stop: block only on what must come before anything else this
        thread could start. An exception it raises ends the run and is raised as is.

        Raises TaskError (the first failing task, its exception as ``__cause__``) after
        the tasks already running have finished and the others were cancelled.
        """
        self.prepare()
        if idle is not None and workers != 1:
            raise ValueError(
                f"idle= needs workers=1, not {workers}: a worker that starts a task "
                "while the calling thread is in idle() would wake no one"
            )
        if (
            self._plain
            and not self.heap  # (priorities or costs order the ready tasks)
            and inline_below > 0
            and timeout is None
            and not keep
            and self._run is None
            and idle is None
            and (GIL if self._grain is None else self._grain < inline_below)
        ):
            _check_workers(workers)
            run = self._run = Run(self, workers, trace, incremental=False)
            try:  # (the graph holds the run: a body's add/taskwait/taskgroup finds it)
                report = run.run_inline(inline_below, probe=self._grain is None)
            finally:
                self._run = None
        else:
            self._start(workers, trace, keep, incremental=False, idle=idle)
            report = self.join(timeout=timeout)
        # (a run whose bodies added children never replays inline: they need a run)
        n = len(report)
        self._grain = report.busy / n if n and n == len(self.tasks) else None
        return report

    def start(
        self,
        workers: int = 2,
        *,
        trace: str | os.PathLike | TraceFile | None = None,
        keep: Iterable[Hashable] = (),
    ) -> None:
        """Start running in the background; ``add`` keeps adding to the running graph.

        ``workers - 1`` threads start now; the calling thread joins them in
        ``taskwait``, ``taskgroup`` exits and ``join``. Values of the items' current
        versions stay until ``join``: a task added later may read them with ``Ref``,
        whether or not their writer has finished by then.
        """
        self._start(workers, trace, keep, incremental=True)

    def _start(
        self,
        workers: int,
        trace: Any,
        keep: Any,
        incremental: bool,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        if self._run is not None:
            raise RuntimeError(f"graph {self.name!r} is already running; join() it first")
        _check_workers(workers)
        self.prepare()
        for slot in self.slots:
            slot.keep = False
        for item in items(keep):
            self._keep(item)
        self._run = Run(self, workers, trace, incremental, idle)
        self._run.begin()

    def join(self, timeout: float | None = None) -> RunReport:
        """Wait for every task, stop the worker threads, return the report.

        Raises TaskError for a failed task, TaskTimeoutError after ``timeout`` seconds.
        """
        run = self._require_run("join")
        incremental = run.incremental
        try:
            return run.finish(timeout)
        finally:
            self._run = None
            if incremental:
                self._forget_unread()

    def _forget_unread(self) -> None:
        """After an incremental run: drop the value slots that ``start`` kept for
        readers that never came, so that replays do not publish them (and tasks left
        with no extras are plain again)."""
        self._prepared = False  # tasks may have gained or lost extras: plain or not
        dead = {s for s in self.slots if not s.readers and not s.keep}
        if not dead:
            return
        self.slots = [s for s in self.slots if s not in dead]
        for st in self.scope.values():
            if st.slot in dead:
                st.slot = None
        for t in self.tasks:
            x = t.x
            if x is not None and x.publishes is not None:
                x.publishes = [s for s in x.publishes if s not in dead] or None
                if x.empty():
                    t.x = None

    def taskwait(
        self,
        on: Any = None,
        *,
        in_: Any = (),
        out: Any = (),
        inout: Any = (),
        mutexinoutset: Any = (),
        inoutset: Any = (),
    ) -> None:
        """Wait for the sibling tasks added so far (by this task body, or at top level).

        Without clauses: for all of them (OpenMP's ``taskwait``). With clauses, only
        for the earlier siblings a task with those clauses would wait for (OpenMP's
        ``taskwait depend(...)``): ``in_`` for the last writer of each item (the
        ``out``/``inout``/``mutexinoutset``/``inoutset`` tasks; readers may still run);
        ``out``/``inout`` for every earlier task touching the item; ``mutexinoutset``/
        ``inoutset`` for every one but the members of a trailing set of the same kind
        (OpenMP forbids ``mutexinoutset`` on taskwait; here it means just that).
        ``on``: shorthand for ``inout``.

        While waiting, the calling thread runs ready tasks: in a task body only
        descendants of that task (OpenMP's task scheduling constraint, which bounds
        how deep waits nest). Raises TaskError if a task failed.
        """
        run = self._require_run("taskwait")
        if on is not None:
            inout = (*items(inout), *items(on))
        clauses = (in_, out, inout, mutexinoutset, inoutset)
        if all(type(c) in _NONE and not c for c in clauses):
            run.taskwait(None)  # no clause: every sibling
        else:
            run.taskwait(clauses)

    @contextmanager
    def taskgroup(self) -> Iterator[None]:
        """On exit, wait for every task added inside the block and all their descendants
        (in a task body, running only descendants of that task meanwhile)."""
        run = self._require_run("taskgroup")
        group = run.open_group()
        try:
            yield
        finally:
            run.close_group(group)

    def _require_run(self, what: str) -> Run:
        run = self._run
        if run is None:
            raise RuntimeError(
                f"{what}() needs a running graph: call start() first "
                "(run() starts and joins in one call)"
            )
        if run.probe is not None:
            run.hand_over()
        return run

    def _keep(self, item: Hashable) -> None:
        item = key_of(item)
        st = self.scope.get(item)
        if st is None or st.kind != OUT:
            raise ValueError(f"keep={item!r}: no task writes that item with out= or inout=")
        if st.slot is None:
            st.slot = Slot(item)
            writer = st.group
            writer.publishes = [*(writer.publishes or ()), st.slot]
            self.slots.append(st.slot)
        st.slot.keep = True

    # ----------------------------------------------------------------- analysis
    # Shortcuts to the analysis subpackage, which never runs the graph.
    def critical_path(self) -> tuple[list[Task], float]:
        """The costliest chain of tasks and its total cost (every task needs a ``cost``)."""
        from .analysis import critical_path

        return critical_path(self)

    def lower_bound(self, workers: int) -> float:
        """max(critical path, total cost / workers): no schedule can finish earlier."""
        from .analysis import lower_bound

        return lower_bound(self, workers)

    def schedule(self, workers: int = 2, **kwargs: Any):
        """A static schedule on ``workers`` processors, computed from the tasks' costs
        and not executed: ``run`` schedules dynamically. See
        :func:`.analysis.plan_graph` and :func:`.analysis.schedule.plan`."""
        from .analysis import plan_graph

        return plan_graph(self, workers, **kwargs)


def _check_workers(workers: Any) -> None:
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, not {workers!r}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's automatic cyclic garbage collector while building a big graph.

    Every task and item is a container the collector tracks; as a graph
    grows, each full collection walks all of it again, which doubles the cost of
    ``add`` at a million tasks (see benchmarks/README.md). Nothing a graph builds is
    garbage, so pausing loses nothing; the collector resumes, as it was, on exit.

    >>> with gc_paused():
    ...     g = TaskGraph()
    ...     for i in range(1000):
    ...         _ = g.add(print, out=i)
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
