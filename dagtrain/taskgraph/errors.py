"""Errors of the task graph. Each subclasses a built-in and carries its data."""

from __future__ import annotations

__all__ = ["CycleError", "TaskError", "TaskTimeoutError"]


class TaskError(RuntimeError):
    """A task failed while the graph ran.

    ``task`` is the name of the first task that failed; the exception it raised is
    ``__cause__`` (with its traceback). Tasks that depended on it never started.
    """

    def __init__(self, task: str, cause: BaseException) -> None:
        super().__init__(f"task {task!r} failed: {type(cause).__name__}: {cause}")
        self.task = task
        self.cause = cause

    @property
    def task_name(self) -> str:
        return self.task

    def __reduce__(self):  # keep it picklable for process pools and Airflow's XCom
        return (type(self), (self.task, self.cause))


class TaskTimeoutError(TimeoutError):
    """``run(timeout=...)`` elapsed; ``pending`` names the tasks that had not finished."""

    def __init__(self, timeout: float, pending: list[str]) -> None:
        shown = ", ".join(repr(n) for n in pending[:10])
        more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
        super().__init__(
            f"the graph did not finish within {timeout:g} s; unfinished tasks: {shown}{more}"
            " (a detached task whose event is never fulfilled waits forever: fulfil or fail it)"
        )
        self.timeout = timeout
        self.pending = pending

    def __reduce__(self):
        return (type(self), (self.timeout, self.pending))


class CycleError(ValueError):
    """The graph has a cycle (only ``after=`` edges can make one).

    ``cycle`` lists the task names along it, the first repeated at the end:
    ``["a", "b", "a"]`` means a waits for b and b waits for a.
    """

    def __init__(self, cycle: list[str]) -> None:
        # args = (message, cycle), as graphlib.CycleError has them
        super().__init__("the graph has a cycle: " + " -> ".join(map(str, cycle)), cycle)
        self.cycle = cycle

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.cycle,))
