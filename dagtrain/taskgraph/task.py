"""The records a graph is made of: tasks, data items, value slots, detach events.

Small ``__slots__`` classes, no behaviour beyond their own invariants: the graph
(:mod:`.graph`, :mod:`.deps`) wires them, the runtime (:mod:`.runtime`,
:mod:`.inline`) moves them through their states. A task's run fields are plain
attributes, documented in :class:`Task`, which the runtime writes directly (a method
call per task would cost more than the rest of its bookkeeping); an :class:`Event`'s
state changes only through its own methods. A million tasks must fit in well under a
gigabyte, so every field earns its place and rarely used ones default to ``None``
rather than to an empty container.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Event", "Outputs", "Ref", "Task"]

# Clause kinds, strongest last but one: a task naming one item under two different
# clauses is treated as ``inout`` on it (see TaskGraph.add).
IN, OUT, MUTEX, INOUTSET = 0, 1, 2, 3
CLAUSES = {"in_": IN, "out": OUT, "inout": OUT, "mutexinoutset": MUTEX, "inoutset": INOUTSET}

# Task states within one run.
PENDING, READY, RUNNING, DETACHED, DONE, FAILED, CANCELLED, PARKED = range(8)
STATE_NAMES = ("pending", "ready", "running", "detached", "done", "failed", "cancelled", "parked")
LIVE = (PENDING, READY, RUNNING, PARKED, DETACHED)  # not over: cancelled if a run stops


class Ref:
    """An argument placeholder: the task receives the value published under ``item``.

    ``g.add(f, Ref("act"))`` calls ``f(value_of_act)``, reading the version of ``act``
    written by the latest earlier task with ``out``/``inout`` on it. Using a ``Ref``
    implies ``in`` on the item (or keeps the ``inout`` you declared).
    """

    __slots__ = ("item",)

    def __init__(self, item: Hashable) -> None:
        self.item = item

    def __repr__(self) -> str:
        return f"Ref({self.item!r})"


class Outputs(dict):
    """Return this from a task to publish a different value under each item it writes.

    Without it, a task's return value is published under every item it writes with
    ``out``/``inout``.
    """


# Orders a signal that arrives while no run holds the event against arm()/disarm(),
# so that a fulfil() racing with the start of a run is neither lost nor counted twice.
# Taken only by events' own methods, never on a task's path.
_SIGNALS = threading.Lock()


class Event:
    """A detach event (OpenMP's ``detach`` clause and ``omp_fulfill_event``).

    A task added with ``detach=event`` completes when its function has returned *and*
    ``event.fulfill()`` has been called, from any thread, in either order. Tasks that
    depend on it wait for both. ``event.fail(exc)`` fails the task instead. The event
    is re-armed at the start of every run, so a replayed graph reuses it.

    A signal given while no run holds the event is *early*: it is kept and counts for
    the next run, which starts with the event already fulfilled (or failed), so the task
    completes (or fails) as soon as its function returns. Between two runs the same
    holds, with one exception that keeps late callbacks harmless: when a run ended with
    the task still waiting for its event (the run failed, timed out or was interrupted),
    the first signal after it is that run's late one and is dropped; a further signal
    counts for the next run. A repeated early signal is a no-op.

    >>> from dagtrain.taskgraph import TaskGraph
    >>> g = TaskGraph()
    >>> ev = Event()
    >>> _ = g.add(print, "sent", name="send", out="grad", detach=ev)
    >>> _ = g.add(ev.fulfill, name="network")  # in real life, a callback
    >>> _ = g.add(print, "reduced", name="use", in_="grad")
    >>> _ = g.run(workers=1)
    sent
    reduced
    >>> ev.fulfilled, ev.task.name
    (True, 'send')

    The package changes an event only through its methods: :meth:`bind` (``add``, once),
    :meth:`arm` and :meth:`disarm` (the runtime, at the start and end of each run) and
    :meth:`settle` (the runtime, under its lock, when ``fulfill``/``fail`` arrives).
    """

    __slots__ = ("_done", "_early", "_error", "_owed", "_run", "_task")

    def __init__(self) -> None:
        self._run: Any = None
        self._task: Task | None = None
        self._done = False
        self._error: BaseException | None = None
        self._early: Any = None  # a signal for the next run: True (fulfil) or an exception
        self._owed = False  # the last run ended with its task waiting for this event

    @property
    def fulfilled(self) -> bool:
        """``fulfill()`` was called in the current (or last) run."""
        return self._done

    @property
    def task(self) -> Task | None:
        """The task this event detaches; None until it is passed as ``detach=``."""
        return self._task

    @property
    def error(self) -> BaseException | None:
        """The exception given to ``fail()`` in the current (or last) run, or None."""
        return self._error

    def bind(self, task: Task) -> None:
        """Make this the event of ``task`` (by ``TaskGraph.add``, which checked that it
        detaches no other task)."""
        self._task = task

    def arm(self, run: Any) -> None:
        """Reset for a new run of its task (by the runtime): pending and no error, or
        fulfilled (failed) already if an early signal came since the last run."""
        with _SIGNALS:
            early = self._early
            self._early = None
            self._owed = False
            self._done = early is True
            self._error = None if early is None or early is True else early
            self._run = run

    def disarm(self, owed: bool = False) -> None:
        """The run ended (by the runtime). ``owed``: its task was still waiting for this
        event, so the next signal is that run's late one, and is dropped."""
        with _SIGNALS:
            self._run = None
            self._owed = owed

    def settle(self, error: BaseException | None) -> bool:
        """Record a ``fulfill()`` (``error`` None) or a ``fail(error)``; called by the
        runtime under its lock. False for a repeated ``fulfill()``: nothing changed."""
        if error is not None:
            self._error = error
            return True
        if self._done:
            return False
        self._done = True
        return True

    def fulfill(self) -> None:
        """Complete the detached task. Safe from any thread, never raises once bound.

        While no run holds the event (before the first run, between runs), the signal
        counts for the next run; see the class docstring for a failed run's late one.
        """
        self._signal(None)

    def fail(self, error: BaseException) -> None:
        """Fail the detached task with ``error`` (re-raised from ``run`` as the cause)."""
        if not isinstance(error, BaseException):
            raise TypeError(f"Event.fail() takes an exception, not {type(error).__name__}")
        self._signal(error)

    def _signal(self, error: BaseException | None) -> None:
        if self._task is None:
            raise RuntimeError("this event is not attached to a task: pass it as detach=")
        with _SIGNALS:
            run = self._run
            if run is None:
                # No run holds the event: the late signal of a run that ended with the
                # task waiting for it (dropped), or an early one for the next run (kept).
                # Neither may raise in a callback's thread.
                if self._owed:
                    self._owed = False
                elif self._early is None:
                    self._early = True if error is None else error
                return
        run.signal(self, error)

    def __repr__(self) -> str:
        owner = self._task.name if self._task is not None else None
        state = "fulfilled" if self._done else "pending"
        if self._run is None and self._early is not None:
            state = "fulfilled early" if self._early is True else "failed early"
        return f"<Event of {owner!r} {state}>"


class Slot:
    """One version of a data item's value, alive until its last reader has finished."""

    __slots__ = ("current", "item", "keep", "pin", "readers", "remaining", "value")

    def __init__(self, item: Hashable) -> None:
        self.item = item
        self.readers = 0  # Ref readers of this version in the graph
        self.remaining = 0  # readers still to finish in this run
        self.value: Any = None
        self.current = True  # no later task writes the item (yet)
        self.keep = False  # run(keep=...) asked for this version's value
        # More readers may still be added while the run goes on (an incremental graph,
        # or a task body spawning children): do not drop the value at zero readers.
        self.pin = False

    def droppable(self) -> bool:
        return self.remaining <= 0 and not self.keep and not self.pin


class Bound:
    """A ``Ref`` resolved at add time to the version (slot) it reads."""

    __slots__ = ("slot",)

    def __init__(self, slot: Slot) -> None:
        self.slot = slot


class Mutex:
    """Mutual exclusion among the ``mutexinoutset`` tasks on one item."""

    __slots__ = ("holder", "waiters")

    def __init__(self) -> None:
        self.holder: Task | None = None
        self.waiters: list[Task] = []


class Item(list):
    """Dependence state of one data item within one scope (the sibling tasks of a parent).

    ``group`` is the last writer (``kind == OUT``, a Task) or the last set of
    ``mutexinoutset``/``inoutset`` tasks (a list); ``preds`` is what a new member of
    that set waits for. The record *is* the list of its readers: the ``in`` tasks
    added since ``group`` (one container per item, not two: a big graph's build pays
    Python's cyclic collector per container). Waiting for ``group`` and the readers is
    waiting for every earlier task on the item, because each of them already waits for
    what came before it. Compared and hashed by identity, as any record.
    """

    __slots__ = ("group", "kind", "mutex", "preds", "slot")
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(self, reader: Task | None = None, writer: Task | None = None) -> None:
        # (a new item's first task: its reader, or its writer with ``out``/``inout``)
        if reader is not None:
            self.append(reader)
        self.kind: int | None = None if writer is None else OUT
        self.group: Any = writer
        self.preds: list[Task] | None = None
        self.slot: Slot | None = None
        self.mutex: Mutex | None = None

    @property
    def readers(self) -> list[Task] | None:
        """The ``in`` tasks added since ``group`` (a copy), or None if there are none."""
        return list(self) or None

    def __repr__(self) -> str:
        return f"<Item kind={self.kind} group={self.group!r} readers={list(self)!r}>"


class Extras:
    """The rarely used fields of a task, kept apart so that a plain task stays small and
    the runtime's hot path tests one field (``task.x is None``) instead of eight."""

    __slots__ = ("event", "groups", "gstack", "mutexes", "parent", "publishes", "reads", "scope")

    def __init__(self) -> None:
        self.event: Event | None = None
        self.reads: tuple[Slot, ...] | None = None  # versions it reads through Ref
        self.publishes: list[Slot] | None = None  # versions it writes that someone reads
        self.mutexes: tuple[Mutex, ...] | None = None
        self.parent: Task | None = None  # the task whose body added it
        self.scope: dict | None = None  # dependence state of its own children
        self.gstack: list | None = None  # taskgroups open in its body
        self.groups: tuple | None = None  # taskgroups it belongs to

    def empty(self) -> bool:
        """Every field is None: the task is plain again and needs no record."""
        return all(getattr(self, f) is None for f in Extras.__slots__)


def _extra(name: str) -> property:
    def get(self: Task) -> Any:
        x = self.x
        return None if x is None else getattr(x, name)

    def put(self: Task, value: Any) -> None:
        x = self.x
        if x is None:
            if value is None:
                return
            x = self.x = Extras()
        setattr(x, name, value)

    return property(get, put, doc=f"{name} (see Extras)")


class Task(list):
    """One node of a graph: a callable, its arguments, and its place among the others.

    Returned by :meth:`TaskGraph.add`; pass it to ``after=`` of a later task.

    A task *is* the list of its successors (the tasks that wait for it, in the order
    they were added; ``succs`` gives a copy): one object per task, not two, because a
    big graph's build pays an allocation and Python's cyclic collector per object. Read
    that list, never change it. Tasks compare and hash by identity and do not order;
    ``len(task)`` is its number of successors.

    Fields set by ``add`` (the graph's structure): ``fn``, ``args``, ``kwargs``,
    ``name``, ``priority``, ``cost``, ``index`` (its position in ``TaskGraph.tasks``),
    ``npred`` (how many tasks it waits for) and ``x`` (its rarely used fields, an
    ``Extras`` record, or None).

    Fields shared between the graph and the runtime, written by :mod:`.graph`,
    :mod:`.runtime` and :mod:`.inline` directly (they are the per-task hot path), not
    meant to be set by users:

    ==============  ==============================================================
    ``key``         its ready-queue key, set by ``TaskGraph.prepare``: minus its
                    upward rank when every task has a cost, else minus ``priority``
    ``npred_left``  predecessors not yet done in this run; ready at zero
    ``run_state``   its state in this run, ``PENDING`` ... ``PARKED`` (an int;
                    ``state`` gives its name)
    ``t0``, ``t1``  ``perf_counter()`` when its function was called and returned
    ``worker``      the worker that ran it (0: the calling thread), -1 if it did not
                    run in this run
    ``last``        the task last linked after it by ``add``'s plain path, which so
                    links a task once when it is reached through several items
    ==============  ==============================================================
    """

    __slots__ = (
        "args",
        "cost",
        "fn",
        "index",
        "key",
        "kwargs",
        "last",
        "name",
        "npred",
        "npred_left",
        "priority",
        "run_state",
        "t0",
        "t1",
        "worker",
        "x",
    )

    # A record, not a value: identity, even against a plain list (object's __eq__
    # would defer to list's reflected one); no order.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__  # type: ignore[assignment]

    def __lt__(self, other: object) -> bool:
        raise TypeError(f"tasks do not order ({self!r} against {other!r})")

    __le__ = __gt__ = __ge__ = __lt__

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict | None,
        name: str,
        priority: float,
        cost: float | None,
        index: int,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.name = name
        self.priority = priority
        self.cost = cost
        self.index = index
        self.npred = 0
        self.x: Extras | None = None
        self.last: Task | None = None
        self.npred_left = 0
        self.run_state = PENDING
        self.key: Any = 0
        self.t0 = self.t1 = 0.0
        self.worker = -1

    def __bool__(self) -> bool:
        return True  # a task is a task, whether or not anything waits for it

    @property
    def succs(self) -> list[Task]:
        """The tasks that wait for this one, in the order they were added (a copy)."""
        return list(self)

    event = _extra("event")
    reads = _extra("reads")
    publishes = _extra("publishes")
    mutexes = _extra("mutexes")
    parent = _extra("parent")
    scope = _extra("scope")
    gstack = _extra("gstack")
    groups = _extra("groups")

    @property
    def state(self) -> str:
        """This task's state in the current or last run ("done", "cancelled", ...)."""
        return STATE_NAMES[self.run_state]

    def __repr__(self) -> str:
        return f"<Task {self.name!r} #{self.index} {self.state}>"
