"""What a training try leaves: rank 0's result, the task's summary of it, and how a
failed try failed; typed, each with one writer and one reader.

- :class:`TrainResult`: rank 0's result, written by the rank
  (``python -m dagtrain.training.rank CONFIG RESULT``) and read back by the launching
  side (``TrainResult.from_json``).
- :class:`TrainSummary`: ``result.json`` of a training folder (``TrainFiles.result``):
  the result without its per-step times, with what this try did itself. Written by the
  train phase (:func:`write_summary`), read by the tracker, ``dagtrain run``'s summary
  and the training page (:func:`read_summary`).
- :class:`FailureRecord`: ``failure-try<N>.json`` (``TrainFiles.failure(n)``), how a
  try's ranks failed. Written by the train phase (:func:`write_failure`), read by the
  training page (:func:`read_failure`).

A reader ignores a field it does not know (a newer version wrote it) and gives None for
a file that is missing or is not such a record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagtrain.config import OBJECTIVE_METRICS

from .jsonfile import read_object, write_json
from .typed import from_doc, from_doc_or_none

__all__ = [
    "FailureRecord",
    "TrainFigures",
    "TrainResult",
    "TrainSummary",
    "metric_names",
    "read_failure",
    "read_summary",
    "write_failure",
    "write_summary",
]


def metric_names(row: dict[str, Any]) -> list[str]:
    """The objective's metrics an epoch row reports, in the objective's order (``mse``,
    ``mae``, ``r2``, ``loss``): the names of its ``train_<m>`` keys (exactly the
    objective's metrics; the ``val_`` and ``test_`` keys also hold sums such as
    ``val_correct``), ordered as the built-in objective with those metrics lists them
    (a JSON file written with sorted keys has lost the order), an author's objective's
    as the row has them, ``loss`` last. A row from before objectives had no
    ``train_accuracy``: its ``val_``/``test_`` accuracy and loss count too."""
    names = [k.removeprefix("train_") for k in row if k.startswith("train_")]
    for old in ("accuracy", "loss"):
        if old not in names and (f"val_{old}" in row or f"test_{old}" in row):
            names.append(old)
    builtin = next((list(m) for m in OBJECTIVE_METRICS.values() if set(m) == set(names)), None)
    if builtin is not None:
        names = builtin
    return [n for n in names if n != "loss"] + (["loss"] if "loss" in names else [])


@dataclass
class TrainFigures:
    """What a training run reports: the fields rank 0's result and the task's summary
    share."""

    rank: int
    world: int
    backend: str
    steps: int = 0
    skipped_steps: int = 0
    epochs: list[dict[str, float]] = field(default_factory=list)
    checkpoint: str | None = None
    resumed_from_step: int | None = None
    resumed_epochs: int = 0  # epochs complete in the checkpoint resumed from
    samples_per_second: float = 0.0
    trace: str | None = None
    params_sha256: str = ""  # checkpoint.state_digest of the final model
    config: dict[str, Any] = field(default_factory=dict)  # the TrainConfig received
    bucket_bytes: list[int] = field(default_factory=list)  # gradient buckets, in sync order
    # a pipeline-parallel run's stages, replicas, microbatches, order, split, this rank's
    # stage and replica, its peak activation bytes and measured bubble (None otherwise)
    pipeline: dict[str, Any] | None = None
    # why the ranks stopped before the last step: "regrow" (an elastic run stopped at an
    # epoch's end to start again on more ranks); None when they trained to the end
    stopped_for: str | None = None
    # an elastic run's world changes, as the launching side recorded them (see
    # dagtrain.training.driver.elastic); empty for a run that kept its ranks
    world_changes: list[dict[str, Any]] = field(default_factory=list)
    # with training.early_stopping: the metric watched ("val_loss"), its direction, the
    # best epoch (numbered from 0, as the rows are) and its value, the epoch training
    # stopped after (None: it ran to its last step) and why, in words
    early_stop: dict[str, Any] | None = None

    @property
    def objective_metrics(self) -> list[str]:
        """The objective's metrics, as the last epoch reports them (:func:`metric_names`);
        none before an epoch ended."""
        return metric_names(self.epochs[-1]) if self.epochs else []

    def held_out(self, metric: str, split: str = "val") -> float | None:
        """The last epoch's ``metric`` (``accuracy``, ``mse``, ``perplexity``, ...) on
        ``split``: ``val``, ``eval_data`` (the validation split), or ``test``, the
        held-out test split of a run without ``eval_data``; None where it has none."""
        return self.epochs[-1].get(f"{split}_{metric}") if self.epochs else None

    @property
    def test_accuracy(self) -> float | None:
        """The last epoch's accuracy on the held-out test split (a run without
        ``eval_data``), or None (a classification's; :meth:`held_out` for any metric)."""
        return self.held_out("accuracy", "test")

    @property
    def val_accuracy(self) -> float | None:
        """The last epoch's accuracy on ``eval_data`` (the validation split), or None (a
        classification's; :meth:`held_out` for any metric)."""
        return self.held_out("accuracy")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, doc: Any) -> Any:
        """The record a JSON document holds (fields it does not declare ignored); None
        when it is not one."""
        return from_doc_or_none(cls, doc)


@dataclass
class TrainResult(TrainFigures):
    """Rank 0's result of one launch of the ranks."""

    step_seconds: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainResult:
        return cls(**json.loads(text))


@dataclass
class TrainSummary(TrainFigures):
    """``result.json``: rank 0's result without its per-step times, with what this try
    did itself and where the ranks ran."""

    median_step_seconds: float | None = None
    # what this try did itself: a resume mid-epoch trains the rest of that epoch, so
    # steps_trained_now > 0 with epochs_trained_now == 0 is work done, not lost
    epochs_trained_now: int = 0
    steps_trained_now: int = 0
    # the host each rank said it ran on (its hostname), by rank (a JSON object's keys)
    placement: dict[str, str] = field(default_factory=dict)
    # where the initial weights came from (training.init): {"kind": "scratch" |
    # "champion" | "file", "version": the champion's number, "path": the file, "note":
    # what a user should know (no champion yet: trained from scratch)}; set by the
    # train phase
    init: dict[str, Any] | None = None

    @classmethod
    def of_result(cls, res: TrainResult, placement: dict[int, str]) -> TrainSummary:
        times = sorted(res.step_seconds)
        shared = {f.name: getattr(res, f.name) for f in dataclasses.fields(TrainFigures)}
        return cls(
            **shared,
            median_step_seconds=times[len(times) // 2] if times else None,
            epochs_trained_now=len(res.epochs) - res.resumed_epochs,
            steps_trained_now=res.steps - (res.resumed_from_step or 0),
            placement={str(r): h for r, h in sorted(placement.items())},
        )

    def to_dict(self) -> dict[str, Any]:
        # (val_accuracy: eval_data's, the prepared validation split; kept in the file for
        # the tools that read it)
        return dataclasses.asdict(self) | {"val_accuracy": self.val_accuracy}


@dataclass
class FailureRecord:
    """How a try's ranks failed: a ``RankFailure``'s fields (its ``to_dict``), with
    ``how`` the whole first sentence as the page shows it (``rank 1 on host b was killed
    by SIGKILL``) and ``ended`` the RankFailure's own ``how`` (``was killed by
    SIGKILL``)."""

    rank: int | None = None
    host: str | None = None
    how: str | None = None
    ended: str | None = None
    summary: str | None = None
    error: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    step: int | None = None
    role: str | None = None
    stage: int | None = None
    lost_with: list[int] = field(default_factory=list)
    bad_input: bool = False
    last_lines: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    traceback: str | None = None

    @classmethod
    def of_failure(cls, e: Any) -> FailureRecord:
        """The record of RankFailure ``e``."""
        return from_doc(cls, e.to_dict() | {"how": e.summary, "ended": e.how})

    @classmethod
    def of(cls, doc: Any) -> FailureRecord | None:
        return from_doc_or_none(cls, doc)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def write_summary(path: Path, summary: TrainSummary) -> None:
    write_json(Path(path), summary.to_dict())


def read_summary(path: Path) -> TrainSummary | None:
    return TrainSummary.of(read_object(path) or None)


def write_failure(path: Path, record: FailureRecord) -> None:
    write_json(Path(path), record.to_dict())


def read_failure(path: Path) -> FailureRecord | None:
    return FailureRecord.of(read_object(path) or None)
