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
:func:`epochs` the only way they are read back. Standard library only.
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


def end_line(step: int, total_steps: int) -> dict[str, Any]:
    return {"kind": Kind.END, "step": step, "total_steps": total_steps, "time": time.time()}


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
