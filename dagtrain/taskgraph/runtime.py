"""The runtime: executes a prepared TaskGraph on a team of threads.

Design
------
One lock guards all run state; a worker holds it only to pick a task and to retire
one, so each task costs one acquire/release pair, a few attribute stores, and one
decrement per successor. The thread that calls ``join`` (or ``taskwait``) is a member
of the team, as OpenMP's encountering thread is: ``workers=1`` runs everything in the
caller, with no thread started. A worker's loop and that of a thread waiting in a task
body differ in which tasks they start and how they wait; both call, time and retire a
task by one path (``Run._run_ready``).

State
~~~~~
ready            FIFO deque in program order, or, when tasks have different keys, a
                 heap of ``(key, index, task)``: key is minus the upward rank when every
                 task has a cost (critical path first), else minus ``priority``.
task.npred_left  predecessors not yet done in this run; at zero the task becomes
                 ready (``mutexinoutset`` tasks first take their item mutexes, or park
                 on one). It, ``task.run_state``, ``task.t0``/``t1`` and ``task.worker``
                 are fields of the task itself (see :class:`~.task.Task`), written here
                 directly: no lookup, no call per task.
outstanding      tasks added and not yet done; the run is over at zero.
idle             threads waiting on the condition; a retiring thread wakes only as many
                 as there are extra ready tasks (it takes one itself), so empty tasks do
                 not pay for wake-ups nobody needs.
watchers         threads in taskwait/join, waiting for a predicate: every retirement
                 wakes them all.
on_idle          ``run(idle=fn)`` (one worker: the calling thread): called, the lock
                 released, whenever that thread finds no ready task, before it waits;
                 it may block to settle an event itself (see ``TaskGraph.run``).
below            ``{task: its ready descendants}`` for each task whose body has added
                 children and not yet returned: the tasks a thread waiting in it may
                 start (below).

Task scheduling constraint
~~~~~~~~~~~~~~~~~~~~~~~~~~
A thread that waits in a task body (``taskwait``, the end of a ``taskgroup``) starts
only descendants of the task it waits in, as OpenMP requires of tied tasks; the
others wait for a thread that is free. Each task it starts there is a strict
descendant of the one below it on the thread's stack, so waits nest at most as deep
as the program's own task tree, not as deep as the number of tasks. It cannot
deadlock: what a task waits for (its children, their dependences, a taskgroup's
descendants) lies within its own subtree, and whichever thread holds the deepest
waiting task can start every ready task of that subtree. A child task, when it
becomes ready, is queued both in ``ready`` and in the ``below`` list of each ancestor
whose body still runs (O(depth)); whichever thread takes it first runs it and the
other entries are skipped when popped. Top-level tasks, and threads that wait at top
level (``join``, ``taskwait`` outside a task), are unaffected.

What it uses of the graph: ``tasks`` (to which it appends the top-level tasks added
while it runs), ``heap``, ``slots``, ``scope`` and ``task_names`` (see
:class:`~.graph.TaskGraph`). A detach event changes only through
its own methods (``arm``, ``settle``, ``disarm``).

A task completes when its function has returned and, for a detached task, its event
was fulfilled; the retiring thread then releases what the task read (dropping a value
version whose last reader this was), publishes what it wrote, and readies successors.

Failure: the first exception is stored with its task, ``stopping`` is set, and each
thread leaves after the task it is running; ``finish`` then cancels every task that did
not run, joins the threads and raises ``TaskError`` from the original exception. A
task that depends on a failed task can therefore never start. A wait in a task body
also ends at join's deadline; when the run stops with no task failed (timeout,
interrupt), such a wait raises ``Unwind``, which cancels the body instead of failing it.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from time import monotonic, perf_counter
from typing import TYPE_CHECKING, Any

from . import inline
from .deps import pin_current
from .errors import TaskError, TaskTimeoutError
from .nesting import Group, Nesting, Unwind
from .report import RunReport
from .task import (
    CANCELLED,
    DETACHED,
    DONE,
    FAILED,
    LIVE,
    PARKED,
    PENDING,
    READY,
    RUNNING,
    Bound,
    Event,
    Outputs,
    Task,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .graph import TaskGraph

__all__ = ["Run"]


class _Timeout(Exception):
    pass


class Run(Nesting):
    """The state of one run of a graph (see the module docstring)."""

    def __init__(
        self,
        graph: TaskGraph,
        workers: int,
        trace: Any,
        incremental: bool,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        self.graph = graph
        self.on_idle = idle  # see ``TaskGraph.run``
        self.incremental = incremental
        self.workers = workers
        self.trace = trace
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.heap = graph.heap
        self.ready: Any = [] if self.heap else deque()
        self.idle = 0
        self.watchers = 0
        self.outstanding = 0
        self.error: tuple[Task, BaseException] | None = None
        self.stopping = False
        self.closing = False
        self.tasks: list[Task] = list(graph.tasks)
        self.threads: list[threading.Thread] = []
        self.wid_of: dict[int, int] = {}
        self.current: list[Task | None] = [None] * workers
        self.main_groups: list[Group] = []
        self.children: dict[Task, list[Task]] = {}
        self.below: dict[Task, Any] = {}  # see "Task scheduling constraint"
        self.nchild = 0
        self.t0 = 0.0
        self.evtasks: list[Task] = []  # tasks with a detach event, to unbind at the end
        self.deadline: float | None = None  # join's timeout, for waits in task bodies too
        self.timed_out = False
        self.probe: Any = None  # a first run still inline (see .inline): hand_over first

    def hand_over(self) -> None:
        """A task body adds or waits while the run is still inline (``.inline``): hand
        the run to the team first."""
        probe = self.probe
        if probe is not None:
            with self.lock:
                inline.take_over(self, probe)

    def run_inline(self, inline_below: float, probe: bool) -> RunReport:
        """Run a prepared plain graph in the calling thread: :func:`.inline.run_inline`."""
        return inline.run_inline(self, inline_below, probe)

    # ------------------------------------------------------------ lifecycle
    def begin(self) -> None:
        if self.incremental:  # keep the current versions' values for later readers
            pin_current(self.graph.scope, self.graph.slots)
        tasks = self.tasks
        heap, ready = self.heap, self.ready
        mutexes: set = set()
        special: list[Task] = []  # tasks with extras that are ready at once
        for t in tasks:  # one pass: reset, and ready the plain tasks that can go
            t.npred_left = n = t.npred
            t.worker = -1
            x = t.x
            if x is None:
                if n:
                    t.run_state = PENDING
                else:
                    t.run_state = READY
                    if heap:
                        heapq.heappush(ready, (t.key, t.index, t))
                    else:
                        ready.append(t)
                continue
            t.run_state = PENDING
            ev = x.event
            if ev is not None:
                ev.arm(self)
                self.evtasks.append(t)
            if x.mutexes is not None:
                mutexes.update(x.mutexes)
            if not n:
                special.append(t)
        for m in mutexes:
            m.holder = None
            m.waiters = []
        for t in special:
            self.make_ready(t)
        pin = self.incremental
        for slot in self.graph.slots:
            slot.value = None
            slot.remaining = slot.readers
            slot.pin = pin and slot.current
        self.outstanding = len(tasks)
        self.wid_of[threading.get_ident()] = 0
        self.t0 = perf_counter()
        for wid in range(1, self.workers):
            th = threading.Thread(
                target=self.serve,
                args=(wid,),
                daemon=True,
                name=f"{self.graph.name}-worker-{wid}",
            )
            self.threads.append(th)
            th.start()

    def finish(self, timeout: float | None) -> RunReport:
        deadline = None if timeout is None else monotonic() + timeout
        if self.incremental:
            with self.lock:  # no top-level task can be added from now on
                self.incremental = False
                for slot in self.graph.slots:
                    slot.pin = False
                    if slot.droppable():
                        slot.value = None
        interrupted: BaseException | None = None
        timed_out = False
        self.deadline = deadline
        try:
            self._work(0, self._all_done, deadline)
        except _Timeout:
            timed_out = True
        except BaseException as e:  # KeyboardInterrupt in the caller: stop promptly
            interrupted = e
        with self.lock:
            self.closing = True
            if timed_out or interrupted is not None:
                self.stopping = True
            self.cond.notify_all()
        for th in self.threads:
            th.join()
        end = perf_counter()
        timed_out = timed_out or self.timed_out
        for t in self.evtasks:  # a late fulfil() is dropped, an early one kept for next run
            t.x.event.disarm(owed=t.run_state == DETACHED)
        for p in self.children:  # values of children's items go with the run
            x = p.x
            if x.scope is not None:
                _release_scope(x)
        pending = []
        if timed_out or interrupted is not None or self.error is not None or self.outstanding:
            for t in self.tasks:
                if t.run_state in LIVE:
                    pending.append(t.name)
                    t.run_state = CANCELLED
            report = RunReport.from_tasks(self.tasks, self.t0, end, self.workers, self._values())
        else:  # every task is done: the report in three list passes
            names = self.graph.task_names
            if len(names) != len(self.tasks):
                names = [t.name for t in self.tasks]
            report = RunReport.from_done(
                self.tasks, names, self.t0, end, self.workers, self._values()
            )
        if self.trace is not None:
            from .trace import write_trace

            write_trace(self.trace, report, self.tasks)
        if interrupted is not None:
            raise interrupted
        if self.error is not None:
            task, exc = self.error
            self.error = None
            if isinstance(exc, KeyboardInterrupt):
                raise exc
            raise TaskError(task.name, exc) from exc
        if timed_out:
            raise TaskTimeoutError(timeout or 0.0, pending)
        return report

    def _values(self) -> dict:
        return {s.item: s.value for s in self.graph.slots if s.keep}

    def _all_done(self) -> bool:
        return self.outstanding == 0

    def serve(self, wid: int) -> None:
        self.wid_of[threading.get_ident()] = wid
        try:
            self._work(wid, None, None)
        except BaseException as e:  # a bug of ours, not a task's: do not lose it
            with self.lock:
                if self.error is None:
                    self.error = (Task(self.serve, (), None, f"<worker {wid}>", 0, None, -1), e)
                self.stopping = True
                self.cond.notify_all()

    # ------------------------------------------------------------ the loop
    def _work(self, wid: int, until: Callable[[], bool] | None, deadline: float | None) -> None:
        """Run ready tasks until ``until()`` holds (helpers: until the run closes)."""
        lock = self.lock
        cond = self.cond
        ready = self.ready
        current = self.current
        prev = current[wid]
        joining = until == self._all_done  # join's predicate, inlined (per task)
        helper = self.on_idle if joining else None
        lock.acquire()
        try:
            while not self._run_ready(wid, ready, prev, until, joining, 1):
                if helper is not None:  # it may settle an event itself
                    lock.release()
                    try:
                        helped = helper()
                    finally:
                        try:
                            lock.acquire()
                        except BaseException:  # interrupted as it waited: hold it
                            lock.acquire()
                            raise
                    # what became ready (or ended the run) while the lock was released
                    # woke no one, no thread being idle: look again before the wait,
                    # the lock held from this look to it
                    if helped or ready or self.stopping or not self.outstanding:
                        continue
                if until is not None:
                    self.watchers += 1
                self.idle += 1
                try:
                    if deadline is None:
                        cond.wait()
                    else:
                        left = deadline - monotonic()
                        if left <= 0:
                            raise _Timeout
                        cond.wait(left)
                finally:
                    self.idle -= 1
                    if until is not None:
                        self.watchers -= 1
        finally:
            current[wid] = prev
            if ready and self.idle and not self.stopping:  # we leave: others take it
                cond.notify_all() if self.watchers else cond.notify(len(ready))
            lock.release()

    def _work_within(self, wid: int, parent: Task, until: Callable[[], bool]) -> None:
        """Run ready descendants of ``parent`` until ``until()`` holds: the task
        scheduling constraint of a thread waiting in ``parent``'s body (see the module
        docstring). The lock is not held on entry."""
        lock = self.lock
        cond = self.cond
        lock.acquire()
        own = self.below.get(parent)
        made = own is None  # it added no child: nothing below it can become ready
        if made:
            own = self.below[parent] = [] if self.heap else deque()
        try:
            # (it may start none of the other ready tasks: wake a thread for each)
            while not self._run_ready(wid, own, parent, until, False, 0):
                deadline = self.deadline
                left = None if deadline is None else deadline - monotonic()
                if left is not None and left <= 0:  # join's timeout: stop the run
                    self.timed_out = True
                    self.stopping = True
                    cond.notify_all()
                    continue
                self.watchers += 1
                self.idle += 1
                try:
                    cond.wait(left)
                finally:
                    self.idle -= 1
                    self.watchers -= 1
        finally:
            self.current[wid] = parent
            # (no hand-over of wake-ups: while it slept, watchers > 0 made every
            # wake-up a notify_all, so it absorbed none meant for another thread)
            if made:
                self.below.pop(parent, None)
            lock.release()

    def _run_ready(
        self,
        wid: int,
        own: Any,
        back: Task | None,
        until: Callable[[], bool] | None,
        joining: bool,
        takes: int,
    ) -> bool:
        """Run the tasks of ``own`` on worker ``wid``, one at a time: call each body,
        time it, retire it (ready its successors), and wake idle threads for the ready
        tasks beyond the ``takes`` that its loop starts itself.

        The task path of both loops: ``own`` is the run's ready queue (``_work``) or the
        ready descendants of the task the thread waits in (``_work_within``); ``back`` is
        the task the thread runs between them (``current[wid]``). True when ``until()``
        holds (``joining``: it is join's, read inline; no ``until``: the run closes) or
        the run stops; False when ``own`` has no task to start, and the loop waits. The
        lock is held on entry and on return, also when this raises; it is released
        while a body runs."""
        lock = self.lock
        cond = self.cond
        ready = self.ready
        heap = self.heap
        pop = own.popleft if not heap else None
        current = self.current
        perf = perf_counter
        while True:
            if self.stopping:
                return True
            if until is not None:
                if not self.outstanding if joining else until():
                    return True
            elif self.closing:
                return True
            if not own:
                return False
            task = heapq.heappop(own)[2] if heap else pop()
            x = task.x
            if x is not None and task.run_state != READY:
                continue  # another thread ran it (see "Task scheduling constraint")
            task.run_state = RUNNING
            current[wid] = task
            try:
                lock.release()
                t0 = perf()
                try:
                    if x is None or x.reads is None:
                        kw = task.kwargs
                        result = task.fn(*task.args, **kw) if kw else task.fn(*task.args)
                    else:
                        result = _call_resolved(task)
                    exc = None
                except BaseException as e:
                    result = None
                    exc = e
                t1 = perf()
            finally:
                try:
                    lock.acquire()
                except BaseException:  # interrupted as it waited: raise holding the lock
                    lock.acquire()
                    raise
            current[wid] = back
            task.t0 = t0
            task.t1 = t1
            task.worker = wid
            if exc is not None:
                self.fail(task, exc)
                exc = None
                continue
            if x is None:  # the common case, inlined: ready the successors
                task.run_state = DONE
                for s in task:  # (its successors)
                    n = s.npred_left - 1
                    s.npred_left = n
                    if not n:
                        if s.x is None or s.x.mutexes is None:
                            s.run_state = READY
                            if heap:
                                heapq.heappush(ready, (s.key, s.index, s))
                            else:
                                ready.append(s)
                        else:
                            self.make_ready(s)
                self.outstanding -= 1
            elif not self.retire(task, x, result):
                continue  # it waits for its detach event (or the event failed it)
            result = None
            if self.idle:
                if self.watchers:
                    cond.notify_all()
                elif len(ready) > takes:
                    cond.notify(len(ready) - takes)

    def retire(self, task: Task, x: Any, result: Any) -> bool:
        """The function of a task with extras returned (lock held): release what it
        read, publish what it wrote; complete it unless it waits for its event."""
        if x.scope is not None:  # its body added children and can add no more
            self.below.pop(task, None)
            _release_scope(x)
        if x.reads is not None:
            for slot in x.reads:
                slot.remaining -= 1
                if slot.remaining <= 0 and not slot.keep and not slot.pin:
                    slot.value = None
        if x.publishes is not None:
            _publish(x.publishes, result)
        ev = x.event
        if ev is not None:
            error = ev.error
            if error is not None:
                self.fail(task, error)
                return False
            if not ev.fulfilled:
                task.run_state = DETACHED
                return False
        self.complete(task)
        return True

    def complete(self, task: Task) -> None:
        """Complete a task (lock held): ready its successors, release its mutexes."""
        task.run_state = DONE
        for s in task:  # (its successors)
            n = s.npred_left - 1
            s.npred_left = n
            if not n:
                self.make_ready(s)
        x = task.x
        if x is not None:
            if x.mutexes is not None:
                for m in x.mutexes:
                    if m.holder is task:
                        m.holder = None
                        waiters, m.waiters = m.waiters, []
                        for w in waiters:
                            if w.run_state == PARKED:
                                self.make_ready(w)
            if x.groups is not None:
                for g in x.groups:
                    g.pending -= 1
        self.outstanding -= 1

    def make_ready(self, t: Task) -> None:
        x = t.x
        if x is not None and x.mutexes is not None:
            for m in x.mutexes:
                if m.holder is not None and m.holder is not t:
                    m.waiters.append(t)
                    t.run_state = PARKED
                    return
            for m in x.mutexes:
                m.holder = t
        t.run_state = READY
        heap = self.heap
        if heap:
            heapq.heappush(self.ready, (t.key, t.index, t))
        else:
            self.ready.append(t)
        if x is not None and x.parent is not None:  # a child: its ancestors may wait for it
            below = self.below
            a = x.parent
            while a is not None:
                own = below.get(a)
                if own is not None:
                    if heap:
                        heapq.heappush(own, (t.key, t.index, t))
                    else:
                        own.append(t)
                a = a.x.parent  # a task with children has extras

    def fail(self, task: Task, exc: BaseException) -> None:
        if exc.__class__ is Unwind:  # unfinished, not failed: finish cancels it
            task.run_state = RUNNING
            return
        task.run_state = FAILED
        if self.error is None:
            self.error = (task, exc)
        self.stopping = True
        self.cond.notify_all()

    # ------------------------------------------------------------ detach events
    def signal(self, ev: Event, error: BaseException | None) -> None:
        """``ev.fulfill()`` (``error`` None) or ``ev.fail(error)``, from any thread."""
        with self.lock:
            if self.closing and self.outstanding == 0:
                return
            if not ev.settle(error):
                return  # fulfilled already
            task = ev.task
            if error is not None:
                if task.run_state == DETACHED:
                    self.fail(task, error)
                return
            if task.run_state == DETACHED and not self.stopping:
                self.complete(task)
                if self.idle:
                    self.cond.notify_all() if self.watchers else self.cond.notify(len(self.ready))


def _release_scope(x: Any) -> None:
    """A parent's body returned (or the run ended): no sibling can be added to its
    children any more, so their items' values go once their readers finished."""
    for st in x.scope.values():
        slot = st.slot
        if slot is not None:
            slot.pin = False
            if slot.droppable():
                slot.value = None
    x.scope = None


def _call_resolved(task: Task) -> Any:
    args = [a.slot.value if a.__class__ is Bound else a for a in task.args]
    kw = task.kwargs
    if kw:
        kw = {k: (v.slot.value if v.__class__ is Bound else v) for k, v in kw.items()}
        return task.fn(*args, **kw)
    return task.fn(*args)


def _publish(slots: list, result: Any) -> None:
    if result.__class__ is Outputs:
        for slot in slots:
            if slot.readers or slot.keep or slot.pin:
                slot.value = result.get(slot.item)
    else:
        for slot in slots:
            if slot.readers or slot.keep or slot.pin:
                slot.value = result
