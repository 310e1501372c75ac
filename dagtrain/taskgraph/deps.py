"""Dependence inference: how ``TaskGraph.add`` finds a new task's predecessors.

Per data item and scope (the sibling tasks of one parent) an :class:`~.task.Item` keeps
the last writer, or the last ``mutexinoutset``/``inoutset`` set with what that set
waits for, and the ``in`` readers since. A new task waits for:

==============  ==============================================================
its clause      the earlier tasks it waits for, on that item
==============  ==============================================================
in_             the last writer or set (readers since then run alongside it)
out, inout      the readers since the last writer or set if there are any, else
                that writer or set
mutexinoutset   what the current set waits for, if it joins a mutexinoutset set
inoutset        (same, for an inoutset set); else it opens a new set, as ``out``
==============  ==============================================================

Each of those already waits for everything before it on the item, so these edges
order the task after *every* earlier task that conflicts with it, and adding a task
costs O(items it names) whatever the size of the graph. ``wait_targets`` applies the
same rules to ``taskwait(in_=..., out=...)`` (OpenMP's ``taskwait depend(...)``).

While a graph runs, a task added with ``out``/``inout`` gets a value slot for its
version at once, pinned (kept) until a later writer supersedes it or no more readers
can come (``join``, or the end of the parent's body): a reader added after the writer
finished still finds the value.

``build_task`` validates everything first and changes the graph only once every
check passed: a bad ``add`` raises and leaves the graph as it was. It changes only what
it is given (the scope's items and their value slots, the graph's slot list, the new
task and its event); the caller links the task to its predecessors and records it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from .task import IN, INOUTSET, MUTEX, OUT, PENDING, Bound, Event, Item, Mutex, Ref, Slot, Task

__all__ = [
    "NO_CLAUSE",
    "IdKey",
    "add_plain",
    "build_task",
    "find_cycle",
    "items",
    "key_of",
    "pin_current",
    "unwire_plain",
    "upward_ranks_of",
    "wait_targets",
]

NO_CLAUSE = ()  # a clause's default: the empty tuple is one object, so `is` tests it
_new_list = list.__new__  # a record made without calling __init__ (the build's hot path)

_SEQ = (tuple, list)
_SETS = (set, frozenset)


def items(value: Any) -> Iterable:
    """A clause's items: a tuple/list/set is several items, anything else is one."""
    t = type(value)
    if t is tuple or t is list:
        return value
    if t in _SETS:
        return tuple(value)
    return (value,)


class IdKey:
    """The key of an unhashable data item (a numpy array, a list): its identity."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return type(other) is IdKey and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} at {id(self.obj):#x}>"


def key_of(item: Any) -> Hashable:
    """The item itself if hashable, else its identity."""
    try:
        hash(item)
    except TypeError:
        return IdKey(item)
    return item


def _kinds(clauses: tuple) -> dict:
    """{item: clause kind} of one task; an item under two different clauses is inout."""
    in_, out, inout, mutex, inoutset = clauses
    kinds: dict = {}
    if type(in_) is not tuple or in_:
        for item in in_ if type(in_) in _SEQ else items(in_):
            kinds[item] = IN
    if type(out) is not tuple or out:
        for item in out if type(out) in _SEQ else items(out):
            kinds[item] = OUT  # out joined with anything is inout
    if type(inout) is not tuple or inout:
        for item in inout if type(inout) in _SEQ else items(inout):
            kinds[item] = OUT
    for clause, kind in ((mutex, MUTEX), (inoutset, INOUTSET)):
        if type(clause) is not tuple or clause:
            for item in items(clause):
                prev = kinds.get(item)
                kinds[item] = kind if prev is None or prev == kind else OUT
    return kinds


def kinds_of(clauses: tuple) -> dict:
    try:
        return _kinds(clauses)
    except TypeError:  # an unhashable item: match it by identity
        return _kinds(
            tuple(
                [key_of(x) for x in items(c)] if type(c) is not tuple or c else () for c in clauses
            )
        )


def _ref_items(
    name: str, args: tuple, kwargs: dict | None, kinds: dict, scope: dict
) -> dict | None:
    """{item: None} for every item read through a Ref (adding ``in`` on it), or None."""
    refs: dict | None = None
    for a in (*args, *kwargs.values()) if kwargs else args:
        if a.__class__ is not Ref:
            continue
        item = key_of(a.item)
        k = kinds.get(item)
        if k is None:
            kinds[item] = IN
        elif k in (MUTEX, INOUTSET):
            clause = "mutexinoutset" if k == MUTEX else "inoutset"
            raise ValueError(
                f"task {name!r}: Ref({a.item!r}) reads a value, but the task "
                f"declares {clause} on it; use in_ or inout"
            )
        st = scope.get(item)
        if st is None or st.kind != OUT:
            raise ValueError(
                f"task {name!r}: Ref({a.item!r}) reads a value, but no earlier "
                "task writes that item with out= or inout="
            )
        if refs is None:
            refs = {}
        refs[item] = None
    return refs


def _event(name: str, detach: Any, kwargs: dict | None) -> Event | None:
    if detach is None or detach is False:
        return None
    if detach is True:
        if kwargs and "event" in kwargs:
            raise ValueError(
                f"task {name!r}: detach=True passes event=, which is already "
                "one of its keyword arguments"
            )
        return Event()
    if isinstance(detach, Event):
        owner = detach.task
        if owner is not None:
            raise ValueError(
                f"task {name!r}: this event already detaches task "
                f"{owner.name!r}; use one Event per task"
            )
        return detach
    raise TypeError(f"task {name!r}: detach= takes an Event or True, not {type(detach).__name__}")


def _named(siblings: list[Task], target: str, by: str) -> list[Task]:
    found = [t for t in siblings if t.name == target]
    if not found:
        raise ValueError(f"task {by!r}: after={target!r} names no task of this graph")
    return found


def build_task(
    slots: list[Slot],
    parent: Task | None,
    scope: dict,
    index: int,
    spec: tuple,
    siblings: list[Task] | None,
) -> tuple[Task, list[Task], list[str]]:
    """Make a task and wire its dependences; return it, the tasks it waits for, and the
    ``after`` names left for ``TaskGraph.prepare`` to resolve. The caller links the task
    to those predecessors.

    ``slots``: the graph's value versions of top-level items, to which a new one is
    appended. ``spec``: what ``TaskGraph.add`` was given, as (fn, args, kwargs, name,
    clauses, after, priority, cost, detach). ``siblings``: None while the graph is being
    built (``after`` names may then point forward and are returned); while it runs, the
    tasks added so far under the same parent, among which ``after`` names are resolved
    at once (the task is dynamic: its graph's tasks have states, values may be pinned).
    """
    fn, args, kwargs, name, clauses, after, priority, cost, detach = spec
    dynamic = siblings is not None
    # 1. check everything; nothing in the graph changes before all checks passed
    kinds = kinds_of(clauses)
    refs = _ref_items(name, args, kwargs, kinds, scope) if args or kwargs else None
    after_tasks: list[Task] = []
    after_names: list[str] = []
    if type(after) is not tuple or after:
        for a in items(after):
            if a.__class__ is Task:
                if a.parent is not parent:
                    raise ValueError(
                        f"task {name!r}: after={a.name!r} is not a sibling "
                        "(dependences link tasks of the same parent only)"
                    )
                after_tasks.append(a)
            elif isinstance(a, str):
                if siblings is not None:
                    after_tasks.extend(_named(siblings, a, name))
                else:
                    after_names.append(a)
            else:
                raise TypeError(
                    f"task {name!r}: after= takes tasks or task names, not {type(a).__name__}"
                )
    ev = _event(name, detach, kwargs)

    # 2. wire
    task = Task(fn, args, kwargs or None, name, priority, cost, index)
    if parent is not None:
        task.parent = parent
    deps: list[Task] = after_tasks
    mutexes = None
    for item, kind in kinds.items():
        st = scope.get(item)
        if st is None:
            st = scope[item] = Item()
        if refs is not None and item in refs:
            refs[item] = _reader_slot(slots, st, item, dynamic, parent is None)
        k = st.kind
        if kind == IN:
            if k == OUT:
                deps.append(st.group)
            elif k is not None:
                deps.extend(st.group)
            st.append(task)  # one of the readers since
            continue
        if st.slot is not None:
            supersede(st)
        r = st  # the readers since the last writer or set
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
            if dynamic:  # keep this version's value for readers that come later
                _version_slot(slots, st, item, task, parent is None)
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
        st.clear()  # no readers since this task
    if mutexes is not None:
        task.mutexes = mutexes
    if refs is not None:
        task.reads = tuple(dict.fromkeys(refs.values()))
        task.args = tuple(Bound(refs[key_of(a.item)]) if a.__class__ is Ref else a for a in args)
        if kwargs:
            task.kwargs = {
                k: Bound(refs[key_of(v.item)]) if v.__class__ is Ref else v
                for k, v in kwargs.items()
            }
    if ev is not None:
        if detach is True:
            task.kwargs = {**(task.kwargs or {}), "event": ev}
        ev.bind(task)
        task.event = ev
    if len(deps) > 1:
        deps = list(dict.fromkeys(deps))
    task.npred = len(deps)
    return task, deps, after_names


def _reader_slot(slots: list[Slot], st: Item, item: Hashable, dynamic: bool, top: bool) -> Slot:
    """The value slot of the item's current version, made when its first reader comes."""
    slot = st.slot
    if slot is None:
        slot = st.slot = Slot(item)
        writer = st.group
        if writer.publishes is None:
            writer.publishes = [slot]
        else:
            writer.publishes.append(slot)
        if top:
            slots.append(slot)
        if dynamic:
            slot.pin = True  # the graph is running: later adds may read it too
    slot.readers += 1
    if dynamic:
        slot.remaining += 1
    return slot


def _version_slot(slots: list[Slot], st: Item, item: Hashable, writer: Task, top: bool) -> Slot:
    """A pinned value slot for ``writer``'s version of the item (it publishes there)."""
    slot = st.slot = Slot(item)
    slot.pin = True
    pub = writer.publishes
    writer.publishes = [slot] if pub is None else [*pub, slot]
    if top:
        slots.append(slot)
    return slot


def pin_current(scope: dict, slots: list[Slot]) -> None:
    """Before an incremental run (``TaskGraph.start``): give the current version of every
    item written with out/inout a value slot, so that a task added later may read it
    even if its writer finished first (the runtime pins the current slots)."""
    for item, st in scope.items():
        if st.kind == OUT and st.slot is None:
            _version_slot(slots, st, item, st.group, True)


def wait_targets(scope: dict, clauses: tuple) -> list[Task]:
    """The earlier sibling tasks a ``taskwait`` with these clauses (in_, out, inout,
    mutexinoutset, inoutset) waits for: those a task added now with the same clauses
    would wait for (the table above), OpenMP's ``taskwait depend(...)``. Each of them
    waits for what came before it on the item, so once they are done, so is every
    earlier task the clause conflicts with; the others may still run."""
    found: list[Task] = []
    for item, kind in kinds_of(clauses).items():
        st = scope.get(item)
        if st is None:
            continue
        k, r = st.kind, st  # (the item is the list of its readers since k)
        if kind == IN:  # the last writer or set; the readers since may still run
            if k == OUT:
                found.append(st.group)
            elif k is not None:
                found.extend(st.group)
        elif kind != OUT and k == kind and not r:  # joins the trailing set: its preds
            found.extend(st.preds)
        elif r:  # every earlier task on the item: the readers since the last writer
            found.extend(r)
        elif k == OUT:
            found.append(st.group)
        elif k is not None:
            found.extend(st.group)
    return found


def add_plain(
    scope: dict,
    fn: Callable[..., Any],
    args: tuple,
    name: str,
    priority: float,
    cost: float | None,
    index: int,
    in_: Any,
    out: Any,
    inout: Any,
) -> Task | None:
    """The common task of a build, made and wired in one call: top level, only
    ``in_``/``out``/``inout`` on hashable items, no ``Ref`` argument. Returns None,
    the scope as it was, for anything else (``build_task`` then makes it).

    The rules of :func:`build_task`, the same edges and item states
    (tests/unit/taskgraph/test_build_plain.py builds random programs both ways and
    compares them), inlined: most of a build's time is Python's per-call and per-record
    overhead. Written items first: their edges now, their new state once every item was
    looked up, so that a read of an item this task also writes is seen (and dropped:
    out wins). An unhashable item: :func:`unwire_plain` takes back what was linked.
    The caller appends the task to its graph.
    """
    for a in args:
        if a.__class__ is Ref:
            return None
    get = scope.get
    task = _new_list(Task)  # Task(fn, args, None, name, priority, cost, index)
    task.fn = fn
    task.args = args
    task.kwargs = None
    task.name = name
    task.priority = priority
    task.cost = cost
    task.index = index
    task.npred = 0
    task.x = task.last = None
    task.npred_left = 0
    task.run_state = PENDING
    task.key = 0
    task.t0 = task.t1 = 0.0
    task.worker = -1
    n = 0  # its predecessors, each linked once (p.last is task once linked)
    first = more = None  # the items it writes (their state changes last)
    try:
        for clause in (out, inout):
            if clause is NO_CLAUSE:
                continue
            t = type(clause)
            for item in clause if t is list or t is tuple else items(clause):
                st = get(item)
                if st is None:  # a new item: nothing to wait for
                    st = scope[item] = _new_list(Item)  # Item(), inlined
                    st.kind = st.group = st.preds = st.slot = st.mutex = None
                else:  # the readers since the last writer or set, else
                    # that writer, or that set (a list; None: nothing)
                    g = st.group
                    for p in st if st else (g,) if st.kind == OUT else g or ():
                        if p.last is not task:
                            p.last = task
                            p.append(task)
                            n += 1
                if first is None:
                    first = st
                elif st is not first:
                    if more is None:
                        more = {st}  # (items hash by identity)
                    else:
                        more.add(st)
        if in_ is not NO_CLAUSE:
            t = type(in_)
            for item in in_ if t is list or t is tuple else items(in_):
                st = get(item)
                if st is None:  # a new item: its first reader
                    st = scope[item] = _new_list(Item)
                    st.append(task)
                    st.kind = st.group = st.preds = st.slot = st.mutex = None
                    continue
                if st is first or (more is not None and st in more):
                    continue  # it writes the item too
                k = st.kind
                if k == OUT:  # the last writer
                    p = st.group
                    if p.last is not task:
                        p.last = task
                        p.append(task)
                        n += 1
                        st.append(task)  # one of the readers since
                        continue
                elif k is not None:  # or set
                    for p in st.group:
                        if p.last is not task:
                            p.last = task
                            p.append(task)
                            n += 1
                if not st or st[-1] is not task:  # (named twice)
                    st.append(task)
    except TypeError:  # an unhashable item: matched by identity, in build_task
        unwire_plain(scope, task, (in_, out, inout))
        return None
    except BaseException:  # an item's __hash__/__eq__ raised: as it was
        unwire_plain(scope, task, (in_, out, inout))
        raise
    if first is not None:  # it is now the last writer of what it writes
        for st in (first,) if more is None else (first, *more):
            if st.slot is not None:
                supersede(st)
            st.kind = OUT
            st.group = task
            st.preds = None
            if st:
                st.clear()
    task.npred = n
    return task


def unwire_plain(scope: dict, task: Task, clauses: tuple) -> None:
    """Take back what ``TaskGraph.add``'s plain path did for ``task`` before it met an
    unhashable item (TypeError: ``build_task`` then starts from the graph as it was), or
    an item whose ``__hash__``/``__eq__`` raised (the exception propagates).

    That path changes nothing but this: new items in ``scope`` (written ones empty, read
    ones holding ``task`` alone), ``task`` appended to the readers of items it reads and
    to the successors of its predecessors (each of them linked once, so ``task`` is last
    wherever it was put); the written items' states change only once every item was
    looked up. So every list that ends with ``task`` gives it back, and every item left
    with no writer, no set and no reader was made by it. ``clauses``: (in_, out, inout).
    """
    for clause in clauses:
        for item in items(clause):
            try:
                st = scope.get(item)
            except Exception:  # (unhashable, or its __hash__/__eq__ raised)
                continue
            if st is None:
                continue
            if st and st[-1] is task:
                st.pop()
            if st.kind == OUT:
                preds = [st.group]
            else:
                preds = list(st.group or ())
            for p in (*st, *preds):
                if len(p) and p[-1] is task:
                    p.pop()
            if st.kind is None and not st:
                del scope[item]


def supersede(st: Item) -> None:
    """A new writer: the current version's value may go once its readers finished."""
    slot = st.slot
    if slot is not None:
        slot.current = False
        slot.pin = False
        if slot.droppable():
            slot.value = None
        st.slot = None


def upward_ranks_of(costs: Sequence[float], order: Sequence[Task]) -> list[float]:
    """rank[i] = costs[i] plus the costliest chain of successors after task i.

    ``order``: the tasks in a topological order. ``TaskGraph.prepare`` keys the ready
    queue by these ranks; :func:`.analysis.upward_ranks` is the same with the costs
    checked.
    """
    rank = [0.0] * len(costs)
    for t in reversed(order):
        rank[t.index] = costs[t.index] + max((rank[s.index] for s in t), default=0.0)
    return rank


def find_cycle(tasks: list[Task], left: set[int]) -> list[str]:
    """A cycle among the tasks whose indices are in ``left`` (Kahn's leftovers).

    Every leftover task has a leftover predecessor, so walking predecessors inside
    ``left`` must repeat a task; walking successors could leave the cycle for a task
    that is merely downstream of one.
    """
    preds: dict[int, Task] = {}
    for t in tasks:
        if t.index in left:
            for s in t:  # (its successors)
                if s.index in left and s.index not in preds:
                    preds[s.index] = t
    seen: dict[int, int] = {}
    path: list[Task] = []
    t = tasks[min(left)]
    while t.index not in seen:
        seen[t.index] = len(path)
        path.append(t)
        t = preds[t.index]
    cycle = path[seen[t.index] :]
    cycle.reverse()  # read in edge direction
    names = [c.name for c in cycle]
    return [*names, names[0]]
