"""TaskGraph: tasks whose order is inferred from OpenMP 5.2 ``depend`` clauses.

Building
--------
``add`` appends a task and wires its dependences against the *earlier* tasks that
touched the same data items, in the order tasks were added (OpenMP's sibling-task
rule). Per item the graph keeps only the last writer (or the last
``mutexinoutset``/``inoutset`` set) and the readers since, so adding a task costs
O(number of items it names), whatever the size of the graph:

==============  ===========================================================
clause          waits for earlier tasks on the same item that used
==============  ===========================================================
in_             out, inout, mutexinoutset, inoutset
out, inout      anything
mutexinoutset   anything but mutexinoutset (those exclude each other at run
                time, in any order)
inoutset        anything but inoutset (those run concurrently as a set)
==============  ===========================================================

``after=`` adds control edges, to a Task or to a name. Names may refer to tasks
added later; that is the only way to make a cycle, so validation (``prepare``) is a
topological sort only when such forward references exist.

Values: a task's return value is published under the items it writes (out/inout);
``Ref(item)`` arguments of later tasks receive it. A version's value is dropped as
soon as its last reader finished, unless it is still the item's current version
(then it stays until the next run, readable from ``RunReport.values``).

Running is in :mod:`.runtime`; analysis (critical path, static schedules) in
:mod:`.analysis` and :mod:`.schedule`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import CycleError
from .task import (
    DONE,
    IN,
    INOUTSET,
    MUTEX,
    OUT,
    Bound,
    Event,
    Item,
    Mutex,
    Ref,
    Slot,
    Task,
)

if TYPE_CHECKING:
    from .report import RunReport
    from .runtime import Run

__all__ = ["TaskGraph"]

_SEQ = (tuple, list)
_SETS = (set, frozenset)


def _items(value: Any) -> Iterable:
    """A clause's items: a tuple/list/set is several items, anything else is one."""
    t = type(value)
    if t is tuple or t is list:
        return value
    if t in _SETS:
        return tuple(value)
    return (value,)


def _kinds(clauses: tuple) -> dict:
    """{item: clause kind} of one task; an item under two different clauses is inout."""
    in_, out, inout, mutex, inoutset = clauses
    kinds: dict = {}
    if in_ != ():
        for item in in_ if type(in_) in _SEQ else _items(in_):
            kinds[item] = IN
    if out != ():
        for item in out if type(out) in _SEQ else _items(out):
            kinds[item] = OUT  # out joined with anything is inout
    if inout != ():
        for item in inout if type(inout) in _SEQ else _items(inout):
            kinds[item] = OUT
    for clause, kind in ((mutex, MUTEX), (inoutset, INOUTSET)):
        if clause != ():
            for item in _items(clause):
                prev = kinds.get(item)
                kinds[item] = kind if prev is None or prev == kind else OUT
    return kinds


def _unhashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return True
    return False


class _IdKey:
    """The key of an unhashable data item (a numpy array, a list): its identity."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return type(other) is _IdKey and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} at {id(self.obj):#x}>"


class TaskGraph:
    """A graph of tasks with OpenMP-style data dependences; build once, run many times.

    >>> g = TaskGraph()
    >>> a = g.add(lambda: 1, name="a", out="x")
    >>> b = g.add(lambda x: x + 1, Ref("x"), name="b", out="y")
    >>> g.run(workers=2, keep=["y"]).values["y"]
    2

    Not thread-safe while being built (build it from one thread); while it runs,
    ``add`` may be called from the thread that started it and from task bodies.
    """

    def __init__(self, name: str = "taskgraph") -> None:
        self.name = name
        self.tasks: list[Task] = []
        self._scope: dict[Hashable, Item] = {}
        self._slots: list[Slot] = []
        self._after_names: list[tuple[Task, str]] = []
        self._forward = False  # an after= name may point forward: cycles possible
        self._prepared = False
        self._order: list[Task] | None = None
        self._heap = False
        self._run: Run | None = None

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
        in_: Any = (),
        out: Any = (),
        inout: Any = (),
        mutexinoutset: Any = (),
        inoutset: Any = (),
        after: Any = (),
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
        clauses = (in_, out, inout, mutexinoutset, inoutset)
        run = self._run
        if run is not None:
            return run.add(self, fn, args, kwargs, name, clauses, after, priority, cost, detach)
        task, deps = self._build(
            None,
            self._scope,
            len(self.tasks),
            fn,
            args,
            kwargs,
            name,
            clauses,
            after,
            priority,
            cost,
            detach,
            dynamic=False,
        )
        for p in deps:
            p.succs.append(task)
        self.tasks.append(task)
        self._prepared = False
        return task

    def _build(
        self,
        parent: Task | None,
        scope: dict,
        index: int,
        fn: Callable,
        args: tuple,
        kwargs: dict,
        name: str,
        clauses: tuple,
        after: Any,
        priority: float,
        cost: float | None,
        detach: Any,
        dynamic: bool,
    ) -> tuple[Task, list[Task]]:
        """Make a task and find its predecessors; the caller links ``deps`` to it."""
        task = Task(fn, args, kwargs or None, name, priority, cost, index)
        task.parent = parent
        try:
            kinds = _kinds(clauses)
        except TypeError:  # an unhashable item: match it by identity
            kinds = _kinds(
                tuple(
                    [_IdKey(x) if _unhashable(x) else x for x in _items(c)] if c != () else ()
                    for c in clauses
                )
            )

        refs = None
        if args:
            for a in args:
                if a.__class__ is Ref:
                    refs = self._ref_kinds(name, args, kwargs, kinds)
                    break
        if refs is None and kwargs:
            for a in kwargs.values():
                if a.__class__ is Ref:
                    refs = self._ref_kinds(name, args, kwargs, kinds)
                    break

        deps: list[Task] = []
        mutexes = None
        for item, kind in kinds.items():
            st = scope.get(item)
            if st is None:
                st = scope[item] = Item()
            if refs is not None and item in refs:
                refs[item] = self._reader_slot(st, item, name, dynamic, parent is None)
            k = st.kind
            if kind == IN:
                if k == OUT:
                    deps.append(st.group)
                elif k is not None:
                    deps.extend(st.group)
                r = st.readers
                if r is None:
                    st.readers = [task]
                else:
                    r.append(task)
                continue
            if st.slot is not None:
                self._supersede(st)
            r = st.readers
            if kind == OUT:
                if r:
                    deps.extend(r)
                elif k == OUT:
                    deps.append(st.group)
                elif k is not None:
                    deps.extend(st.group)
                st.kind = OUT
                st.group = task
                st.preds = None
            else:
                if k == kind and not r:
                    deps.extend(st.preds)  # join the current set
                    st.group.append(task)
                else:
                    p = list(r) if r else [st.group] if k == OUT else list(st.group or ())
                    deps.extend(p)
                    st.kind = kind
                    st.group = [task]
                    st.preds = p
                if kind == MUTEX:
                    if st.mutex is None:
                        st.mutex = Mutex()
                    mutexes = (st.mutex,) if mutexes is None else (*mutexes, st.mutex)
            st.readers = None
        if mutexes is not None:
            task.mutexes = mutexes
        if refs is not None:
            task.reads = tuple(dict.fromkeys(refs.values()))
            task.args = tuple(Bound(refs[_key(a)]) if a.__class__ is Ref else a for a in args)
            if kwargs:
                task.kwargs = {
                    k: Bound(refs[_key(v)]) if v.__class__ is Ref else v for k, v in kwargs.items()
                }

        if after != ():
            for a in _items(after):
                if a.__class__ is Task:
                    if a.parent is not parent:
                        raise ValueError(
                            f"task {name!r}: after={a.name!r} is not a sibling "
                            "(dependences link tasks of the same parent only)"
                        )
                    deps.append(a)
                elif isinstance(a, str):
                    if dynamic:
                        deps.extend(self._named(a, parent, name))
                    else:
                        self._after_names.append((task, a))
                        self._forward = True
                else:
                    raise TypeError(
                        f"task {name!r}: after= takes tasks or task names, not {type(a).__name__}"
                    )

        if detach is not None and detach is not False:
            if detach is True:
                if "event" in (kwargs or ()):
                    raise ValueError(
                        f"task {name!r}: detach=True passes event=, "
                        "which is already one of its keyword arguments"
                    )
                ev = Event()
                task.kwargs = {**(task.kwargs or {}), "event": ev}
            elif isinstance(detach, Event):
                ev = detach
                if ev._task is not None and ev._task is not task:
                    raise ValueError(
                        f"task {name!r}: this event already detaches task "
                        f"{ev._task.name!r}; use one Event per task"
                    )
            else:
                raise TypeError(
                    f"task {name!r}: detach= takes an Event or True, not {type(detach).__name__}"
                )
            ev._task = task
            task.event = ev

        if len(deps) > 1:
            deps = list(dict.fromkeys(deps))
        task.npred = len(deps)
        return task, deps

    @staticmethod
    def _ref_kinds(name: str, args: tuple, kwargs: dict, kinds: dict) -> dict:
        """Add ``in`` for every Ref'd item; return {item key: None} to be filled with slots."""
        refs: dict = {}
        for a in (*args, *(kwargs or {}).values()):
            if a.__class__ is Ref:
                item = _key(a)
                k = kinds.get(item)
                if k is None:
                    kinds[item] = IN
                elif k in (MUTEX, INOUTSET):
                    clause = "mutexinoutset" if k == MUTEX else "inoutset"
                    raise ValueError(
                        f"task {name!r}: Ref({a.item!r}) reads a value, but the task "
                        f"declares {clause} on it; use in_ or inout"
                    )
                refs[item] = None
        return refs

    def _reader_slot(self, st: Item, item: Hashable, name: str, dynamic: bool, top: bool) -> Slot:
        if st.kind != OUT:
            raise ValueError(
                f"task {name!r}: Ref({item!r}) reads a value, but no earlier task "
                "writes that item with out= or inout="
            )
        slot = st.slot
        if slot is None:
            slot = st.slot = Slot(item)
            writer = st.group
            if writer.publishes is None:
                writer.publishes = [slot]
            else:
                writer.publishes.append(slot)
            if top:
                self._slots.append(slot)
            if dynamic:
                slot.pin = True  # the graph is running: later adds may read it too
                if writer._state == DONE:
                    raise ValueError(
                        f"task {name!r}: Ref({item!r}) reads the value of task "
                        f"{writer.name!r}, which finished before anyone asked "
                        "for it; add its readers before it runs"
                    )
        slot.readers += 1
        if dynamic:
            slot.remaining += 1
        return slot

    @staticmethod
    def _supersede(st: Item) -> None:
        """A new writer: the current version's value may go once its readers finished."""
        slot = st.slot
        if slot is not None:
            slot.current = False
            slot.pin = False
            if slot.droppable():
                slot.value = None
            st.slot = None

    def _named(self, target: str, parent: Task | None, by: str) -> list[Task]:
        siblings = (
            self.tasks if parent is None else (self._run.children_of(parent) if self._run else [])
        )
        found = [t for t in siblings if t.name == target]
        if not found:
            raise ValueError(f"task {by!r}: after={target!r} names no task of this graph")
        return found

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
                    if task in p.succs:
                        continue
                    p.succs.append(task)
                    task.npred += 1
            self._after_names.clear()
        self._order = self._toposort() if self._forward else None
        self._prepared = True  # before the keys: computing ranks asks for the order
        self._set_keys()

    def _set_keys(self) -> None:
        """Ready-queue keys: minus the upward rank when every task has a cost, else
        minus ``priority``; a FIFO queue (cheaper) when all keys are equal."""
        tasks = self.tasks
        if tasks and all(t.cost is not None for t in tasks):
            from .analysis import upward_ranks

            for t, r in zip(tasks, upward_ranks(self)):
                t._key = -r
        else:
            for t in tasks:
                t._key = -t.priority
        k0 = tasks[0]._key if tasks else 0
        self._heap = any(t._key != k0 for t in tasks)

    def _toposort(self) -> list[Task]:
        npred = [t.npred for t in self.tasks]
        queue = deque(t for t in self.tasks if not t.npred)
        order = []
        while queue:
            t = queue.popleft()
            order.append(t)
            for s in t.succs:
                npred[s.index] -= 1
                if not npred[s.index]:
                    queue.append(s)
        if len(order) != len(self.tasks):
            left = {t.index for t in self.tasks if npred[t.index]}
            raise CycleError(_find_cycle(self.tasks, left))
        return order

    def topological_order(self) -> list[Task]:
        """The tasks in an order that respects every edge (the add order if it does)."""
        self.prepare()
        return list(self._order if self._order is not None else self.tasks)

    # ------------------------------------------------------------------ running
    def run(
        self,
        workers: int = 2,
        *,
        trace: str | None = None,
        timeout: float | None = None,
        keep: Iterable[Hashable] = (),
    ) -> RunReport:
        """Run (or replay) every task; return a :class:`RunReport`.

        ``workers`` threads execute tasks, the calling thread being one of them.
        ``trace``: write a Chrome/Perfetto trace there. ``timeout``: seconds, after which
        ``TaskTimeoutError`` names the unfinished tasks. ``keep``: items whose final
        value ``RunReport.values`` returns.

        Raises TaskError (the first failing task, its exception as ``__cause__``) after
        the tasks already running have finished and the others were cancelled.
        """
        self._start(workers, trace, keep, incremental=False)
        return self.join(timeout=timeout)

    def start(
        self, workers: int = 2, *, trace: str | None = None, keep: Iterable[Hashable] = ()
    ) -> None:
        """Start running in the background; ``add`` keeps adding to the running graph.

        ``workers - 1`` threads start now; the calling thread joins them in
        ``taskwait``, ``taskgroup`` exits and ``join``. Values of the items' current
        versions stay until ``join`` (a task added later may read them).
        """
        self._start(workers, trace, keep, incremental=True)

    def _start(self, workers: int, trace: str | None, keep: Any, incremental: bool) -> None:
        from .runtime import Run

        if self._run is not None:
            raise RuntimeError(f"graph {self.name!r} is already running; join() it first")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, not {workers!r}")
        self.prepare()
        for slot in self._slots:
            slot.keep = False
        for item in _items(keep):
            self._keep(item)
        self._run = Run(self, workers, trace, incremental)
        self._run.begin()

    def join(self, timeout: float | None = None) -> RunReport:
        """Wait for every task, stop the worker threads, return the report.

        Raises TaskError for a failed task, TaskTimeoutError after ``timeout`` seconds.
        """
        run = self._require_run("join")
        try:
            return run.finish(timeout)
        finally:
            self._run = None

    def taskwait(self, on: Any = None) -> None:
        """Wait until the tasks added so far (by this task body, or at top level) are done.

        ``on``: wait only for the earlier tasks that touch these items. While waiting,
        the calling thread runs other ready tasks. Raises TaskError if a task failed.
        """
        self._require_run("taskwait").taskwait(on)

    @contextmanager
    def taskgroup(self) -> Iterator[None]:
        """On exit, wait for every task added inside the block and all their descendants."""
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
        return run

    def _keep(self, item: Hashable) -> None:
        try:
            st = self._scope.get(item)
        except TypeError:
            item = _IdKey(item)
            st = self._scope.get(item)
        if st is None or st.kind != OUT:
            raise ValueError(f"keep={item!r}: no task writes that item with out= or inout=")
        if st.slot is None:
            st.slot = Slot(item)
            writer = st.group
            writer.publishes = [*(writer.publishes or ()), st.slot]
            self._slots.append(st.slot)
        st.slot.keep = True

    # ----------------------------------------------------------------- analysis
    def critical_path(self) -> tuple[list[Task], float]:
        """The costliest chain of tasks and its total cost (every task needs a ``cost``)."""
        from .analysis import critical_path

        return critical_path(self)

    def lower_bound(self, workers: int) -> float:
        """max(critical path, total cost / workers): no schedule can finish earlier."""
        from .analysis import lower_bound

        return lower_bound(self, workers)

    def schedule(self, workers: int = 2, **kwargs: Any):
        """A static schedule on ``workers`` processors; see :func:`.schedule.plan`."""
        from .analysis import plan_graph

        return plan_graph(self, workers, **kwargs)


def _key(ref: Ref) -> Hashable:
    item = ref.item
    try:
        hash(item)
    except TypeError:
        return _IdKey(item)
    return item


def _find_cycle(tasks: list[Task], left: set[int]) -> list[str]:
    """A cycle among the tasks whose indices are in ``left`` (all lie on or after one)."""
    # Walk successors inside ``left`` until a task repeats: every task left over by
    # Kahn's algorithm has a predecessor left over too, so walking *back* always
    # finds a cycle; walking forward may leave ``left`` towards a task only
    # downstream of one. So walk predecessors.
    preds: dict[int, Task] = {}
    for t in tasks:
        if t.index in left:
            for s in t.succs:
                if s.index in left and s.index not in preds:
                    preds[s.index] = t
    start = tasks[min(left)]
    seen: dict[int, int] = {}
    path: list[Task] = []
    t = start
    while t.index not in seen:
        seen[t.index] = len(path)
        path.append(t)
        t = preds[t.index]
    cycle = path[seen[t.index] :]
    cycle.reverse()  # predecessor walk: reverse to read in edge direction
    names = [c.name for c in cycle]
    return [*names, names[0]]
