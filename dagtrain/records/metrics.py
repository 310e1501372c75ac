"""A training task's metrics file (``metrics.jsonl``): one JSON line per event, each
with its ``kind``, appended by several writers and read by several readers.

=========  ==================================  ==========================================
kind       written by                          fields
=========  ==================================  ==========================================
``try``    the training stage, as a try begins ``try`` (Airflow's try number), ``time``
``start``  rank 0, as training starts          ``step``, ``total_steps``,
                                               ``steps_per_epoch``, ``resumed_from_step``
``epoch``  rank 0, at each epoch's end         the epoch's metrics (``epoch``,
                                               ``train_loss``, ...), ``step``,
                                               ``total_steps``, ``samples_per_second``,
                                               ``elapsed``
``end``    rank 0, as training ends            ``step``, ``total_steps``
``world``  the launching side (elastic runs)   :class:`WorldChange`'s public fields
=========  ==================================  ==========================================

Every line also has ``time`` (unix seconds). The builders here are the only places the
lines are made, :func:`append` the only way they are written, :func:`read` and
:func:`epochs` the only way they are read back, and :class:`Tries` the one rule that
groups the lines into tries (the training page's list of tries, ``dagtrain run``'s live
lines). Standard library only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dagtrain.atomic import append_line

__all__ = [
    "Kind",
    "TryEvent",
    "TryLine",
    "Tries",
    "WorldChange",
    "append",
    "end_line",
    "epoch_line",
    "epochs",
    "read",
    "start_line",
    "try_line",
]


class Kind(StrEnum):
    TRY = "try"
    START = "start"
    EPOCH = "epoch"
    END = "end"
    WORLD = "world"


def try_line(number: int) -> dict[str, Any]:
    return {"kind": Kind.TRY, "try": int(number), "time": time.time()}


def start_line(
    step: int, total_steps: int, steps_per_epoch: int, resumed_from_step: int | None
) -> dict[str, Any]:
    return {
        "kind": Kind.START,
        "step": step,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "resumed_from_step": resumed_from_step,
        "time": time.time(),
    }


def epoch_line(
    metrics: dict[str, Any],
    step: int,
    total_steps: int,
    samples_per_second: float,
    elapsed: float,
) -> dict[str, Any]:
    return {
        "kind": Kind.EPOCH,
        **metrics,
        "step": step,
        "total_steps": total_steps,
        "samples_per_second": samples_per_second,
        "elapsed": elapsed,
        "time": time.time(),
    }


def end_line(
    step: int, total_steps: int, early_stop: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run's end; with early stopping, its record (the result's ``early_stop``):
    ``step`` short of ``total_steps`` where it stopped early."""
    line = {"kind": Kind.END, "step": step, "total_steps": total_steps, "time": time.time()}
    return line if early_stop is None else line | {"early_stop": early_stop}


@dataclass
class WorldChange:
    """An elastic run's change of world: ``change`` (``shrink``: fewer ranks,
    ``restart``: the same slots, new processes, ``grow``: a host back), at ``step`` (the
    new world's first; None until it is known), ``from``/``to`` ranks, the ``ranks`` and
    ``hosts`` lost or taken back, ``why``, ``steps_lost``, ``seconds`` (from the loss
    to the new world's first step), ``time`` (of the loss). ``reached`` (the most steps
    a rank of the old world had completed) and ``told`` (the change was reported) are
    the launching side's own, never written."""

    change: str
    from_: int
    to: int
    why: str
    time: float
    step: int | None = None
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    steps_lost: int | None = None
    seconds: float | None = None
    reached: int | None = None
    told: bool = False

    def public(self) -> dict[str, Any]:
        """The line's fields (and the result's ``world_changes`` entry)."""
        d = asdict(self)
        for k in ("reached", "told"):
            d.pop(k)
        return {"kind": Kind.WORLD, "change": d.pop("change"), "step": d.pop("step"),
                "from": d.pop("from_"), **d}  # fmt: skip


def append(path: str | Path, line: dict[str, Any]) -> None:
    """Append one line (a builder's) to the metrics file ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    append_line(path, line)


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every whole line of the metrics file (none when it does not exist yet; a line
    still being written is skipped)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            m = json.loads(raw)
        except ValueError:
            continue
        if isinstance(m, dict):
            out.append(m)
    return out


def epochs(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per epoch, in epoch order: the newest ``epoch`` line of each (a retry
    that trained an epoch again wrote it again), without its ``kind``."""
    rows: dict[int, dict[str, Any]] = {}
    for m in lines:
        if m.get("kind") == Kind.EPOCH and isinstance(m.get("epoch"), int):
            rows[m["epoch"]] = {k: v for k, v in m.items() if k != "kind"}
    return [rows[e] for e in sorted(rows)]


class TryEvent(StrEnum):
    """What a line means for the tries (:class:`Tries`)."""

    TRY = "try"  # a ``try`` line: the try begins
    START = "start"  # the try's first ``start`` line: where training began (or resumed)
    RELAUNCH = "relaunch"  # a later ``start`` line of the same try: an elastic relaunch
    WORLD = "world"  # a ``world`` line: the try's world changed


@dataclass(frozen=True)
class TryLine:
    """One line's meaning for the tries: ``what`` happened to try ``number``, and the
    ``line`` itself. For :attr:`TryEvent.START`, ``resumed_from_step`` (the start line's)
    and ``epochs_done_before`` (whole epochs below it; None without ``steps_per_epoch``)."""

    what: TryEvent
    number: int
    line: dict[str, Any]
    resumed_from_step: int | None = None
    epochs_done_before: int | None = None


class Tries:
    """The rule that groups a metrics file's lines into tries, fed the lines one at a time
    in the file's order (all of them at once, or each as it is appended).

    A ``try`` line begins its try. Each ``start`` line belongs to the newest ``try`` line
    before it: the try's first says where it began (or resumed from), the later ones are
    an elastic run's relaunches on a new world. In a file written before try lines
    existed (no ``try`` line before it), each ``start`` line is a try of its own,
    numbered 1, 2, ... A ``world`` line belongs to the current try (without a ``try``
    line, the newest try so far, else try 1). Other lines, and a ``try`` line without a
    whole number, mean nothing for the tries (:meth:`feed` returns None)."""

    def __init__(self) -> None:
        self.current: int | None = None  # the newest try line's number
        self.started: dict[int, bool] = {}  # each try seen so far: whether it started

    def feed(self, m: dict[str, Any]) -> TryLine | None:
        kind = m.get("kind")
        if kind == Kind.TRY and isinstance(m.get("try"), int):
            self.current = m["try"]
            self.started.setdefault(self.current, False)
            return TryLine(TryEvent.TRY, self.current, m)
        if kind == Kind.WORLD:
            n = max(self.started, default=1) if self.current is None else self.current
            self.started.setdefault(n, False)
            return TryLine(TryEvent.WORLD, n, m)
        if kind == Kind.START:
            n = max(self.started, default=0) + 1 if self.current is None else self.current
            if self.started.get(n):
                return TryLine(TryEvent.RELAUNCH, n, m)
            self.started[n] = True
            resumed, per = m.get("resumed_from_step"), m.get("steps_per_epoch")
            return TryLine(
                TryEvent.START,
                n,
                m,
                resumed_from_step=resumed,
                epochs_done_before=(resumed or 0) // per if per else None,
            )
        return None
