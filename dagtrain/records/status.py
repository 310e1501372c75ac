"""A rank's status record, ``rank<N>.json``: what a rank says about itself, typed.

One writer: :class:`dagtrain.rank_env.StatusRecord` (the rank: as it starts, reaches its
first collective, trains, is made to stop, fails), whose every field is one of
:class:`RankRecord`'s (it refuses any other). One reader: :func:`read_records` (the
launcher's supervision and diagnosis, an elastic run's loss analysis, the training
page), which gives :class:`RankRecord` values; a file that is not a record (half a
copy, another tool's) is skipped, and a field this version does not know is ignored.

The fields, by who sets them and when:

- as the rank starts: ``rank``, ``job`` (the launcher's ``JOB_ID``: a launcher reads
  only its own job's records from a folder earlier tries wrote into too), ``role``
  (``train``), ``host``, ``pid``, ``status`` ``starting``, ``ready`` false, ``step``
  null, ``started``; every write: ``updated`` (unix seconds);
- as it reaches its first collective: ``ready`` true;
- while it trains (``dagtrain.training.rank.progress.RankStatus``): ``status``
  ``running``/``done``, ``step`` (steps completed), ``total_steps``, ``start_step``
  (where this launch began), ``resumed_epochs``, ``first_step_time``, ``steps_timed``,
  ``samples_per_second``, ``median_step_ms``, ``p95_step_ms``, and where it is in a
  pipeline run (``stage``, ``replica``);
- an elastic rank made to stop: ``stopping`` (why), ``stopping_at``, ``rescued`` (the
  step it saved);
- before it exits on an error: ``status`` ``failed``, ``type`` and ``message`` of the
  error, ``fail_fast``, ``time``, ``traceback`` (its tail).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from .jsonfile import read_object
from .names import RANK_RECORD
from .typed import from_doc_or_none

__all__ = ["FIELDS", "RankRecord", "State", "read_record", "read_records"]


class State(StrEnum):
    """A rank's ``status``."""

    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass
class RankRecord:
    """One rank's status record (see the module docstring for who sets what)."""

    rank: int
    job: str | None = None
    role: str | None = None
    host: str | None = None
    pid: int | None = None
    status: str = State.STARTING
    ready: bool = False
    step: int | None = None
    started: float | None = None
    updated: float | None = None
    # while it trains
    total_steps: int | None = None
    start_step: int | None = None
    resumed_epochs: int | None = None
    first_step_time: float | None = None
    steps_timed: int | None = None
    samples_per_second: float | None = None
    median_step_ms: float | None = None
    p95_step_ms: float | None = None
    stage: int | None = None
    replica: int | None = None
    # an elastic rank made to stop
    stopping: str | None = None
    stopping_at: float | None = None
    rescued: int | None = None
    # a failure
    type: str | None = None
    message: str | None = None
    fail_fast: bool = False
    time: float | None = None
    traceback: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == State.FAILED

    @property
    def done(self) -> bool:
        return self.status == State.DONE

    @property
    def error(self) -> str:
        """``Type: message`` of the failure it reported."""
        return f"{self.type}: {self.message}"

    @property
    def answered(self) -> bool:
        """It failed, finished, was made to stop or saved a rescue: it did not die
        without a word."""
        return (
            self.status in (State.FAILED, State.DONE)
            or bool(self.stopping)
            or self.rescued is not None
        )

    @classmethod
    def of(cls, doc: Any) -> RankRecord | None:
        """The record a JSON document holds; None when it is not one (no int ``rank``)."""
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool):
            return None
        return from_doc_or_none(cls, doc)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = frozenset(f.name for f in dataclasses.fields(RankRecord))


def read_record(path: str | Path) -> RankRecord | None:
    """The record in ``path``; None when there is none or it is not one."""
    return RankRecord.of(read_object(Path(path)))


def read_records(folder: str | Path | None, job: str | None = None) -> dict[int, RankRecord]:
    """The status records in ``folder`` by rank (those of job ``job`` only, when given)."""
    found: dict[int, RankRecord] = {}
    if folder is None:
        return found
    for path in Path(folder).glob("*"):
        if RANK_RECORD.match(path.name) is None:
            continue
        record = read_record(path)
        if record is not None and (job is None or record.job == job):
            found[record.rank] = record
    return found
