"""RunReport: what a run did, per task and overall."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from math import fsum
from typing import TYPE_CHECKING, Any

from .task import STATE_NAMES

if TYPE_CHECKING:
    from .task import Task

__all__ = ["RunReport", "TaskRecord"]


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task of a run: seconds from the run's start, the worker (0 = calling thread)."""

    name: str
    start: float
    end: float
    worker: int
    state: str

    @property
    def duration(self) -> float:
        return self.end - self.start


class RunReport:
    """Per-task start/end/worker, the makespan and the utilisation of one run.

    Records are kept in columns and made into :class:`TaskRecord` on demand, so a
    report of a million tasks costs a few lists, not a million objects.
    """

    def __init__(
        self,
        names: Sequence[str],
        starts: Sequence[float],
        ends: Sequence[float],
        workers_of: Sequence[int],
        states: Sequence[str],
        workers: int,
        wall: float,
        values: dict[Hashable, Any],
    ) -> None:
        self.names = names
        self.starts = starts
        self.ends = ends
        self.workers_of = workers_of
        self.states = states
        self.workers = workers
        self.wall = wall
        self.values = values

    @classmethod
    def from_tasks(
        cls, tasks: list[Task], t0: float, end: float, workers: int, values: dict[Hashable, Any]
    ) -> RunReport:
        ran = [t.worker >= 0 for t in tasks]  # its function was called in this run
        return cls(
            names=[t.name for t in tasks],
            starts=[t.t0 - t0 if r else 0.0 for t, r in zip(tasks, ran)],
            ends=[t.t1 - t0 if r else 0.0 for t, r in zip(tasks, ran)],
            workers_of=[t.worker if r else -1 for t, r in zip(tasks, ran)],
            states=[STATE_NAMES[t.run_state] for t in tasks],
            workers=workers,
            wall=end - t0,
            values=values,
        )

    @classmethod
    def from_done(
        cls,
        tasks: list[Task],
        names: list[str],
        t0: float,
        end: float,
        workers: int,
        values: dict[Hashable, Any],
    ) -> RunReport:
        """The report of a run in which every task ran and is done."""
        return cls(
            names=names,
            starts=[t.t0 - t0 for t in tasks],
            ends=[t.t1 - t0 for t in tasks],
            workers_of=[t.worker for t in tasks],
            states=["done"] * len(tasks),
            workers=workers,
            wall=end - t0,
            values=values,
        )

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[TaskRecord]:
        for i in range(len(self.names)):
            yield self.record(i)

    def record(self, i: int) -> TaskRecord:
        return TaskRecord(
            self.names[i], self.starts[i], self.ends[i], self.workers_of[i], self.states[i]
        )

    @property
    def records(self) -> list[TaskRecord]:
        """Every task's record, in the order the tasks were added."""
        return list(self)

    @property
    def tasks(self) -> dict[str, TaskRecord]:
        """Records by task name (of tasks sharing a name, the first one added)."""
        out: dict[str, TaskRecord] = {}
        for i, name in enumerate(self.names):
            if name not in out:
                out[name] = self.record(i)
        return out

    def __getitem__(self, name: str) -> TaskRecord:
        """The record of the (first) task of that name."""
        try:
            return self.record(self.names.index(name))
        except ValueError:
            raise KeyError(f"no task named {name!r} in this run") from None

    @property
    def makespan(self) -> float:
        """Seconds from the run's start until its last task ended."""
        return max((e for e, w in zip(self.ends, self.workers_of) if w >= 0), default=0.0)

    @property
    def busy(self) -> float:
        """Seconds spent inside task functions, summed over tasks."""
        if -1 not in self.workers_of:  # every task ran: two C-level (exact) sums
            return fsum(self.ends) - fsum(self.starts)
        return sum(e - s for s, e, w in zip(self.starts, self.ends, self.workers_of) if w >= 0)

    @property
    def utilisation(self) -> float:
        """busy / (makespan x workers): 1.0 means no worker ever waited."""
        span = self.makespan
        return self.busy / (span * self.workers) if span > 0 else 0.0

    utilization = utilisation

    def __repr__(self) -> str:
        return (
            f"<RunReport {len(self)} tasks, makespan {self.makespan * 1e3:.3f} ms, "
            f"utilisation {self.utilisation:.0%} on {self.workers} workers>"
        )
