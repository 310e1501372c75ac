"""What a training run tells the outside while it runs: files others poll.

``Progress``: rank 0's JSON lines (``metrics_file``), one per event — what ``dagtrain
run`` and the training page tail for each epoch. ``RankStatus``: every rank's own small
JSON file (``status_dir/rank<N>.json``: its status record, ``dagtrain.rank_env``),
rewritten atomically every few seconds and at each epoch's end: its host and pid, the
step it is at, samples/s, median and p95 step time — the training page's ranks table,
live.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from dagtrain.rank_env import StatusRecord, record_path, this_rank
from dagtrain.records import metrics

__all__ = ["Progress", "RankStatus", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank; None if empty."""
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


class Progress:
    """Rank 0's progress, one line per event appended to ``metrics_file``
    (:mod:`dagtrain.records.metrics`: ``start``, ``epoch``, ``end``): what a task tails
    to show each epoch as it ends."""

    def __init__(self, path: str | None, batch_size: int) -> None:
        self.path = path
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.batch = batch_size
        self.t0 = self.t_last = time.time()
        self.step_last = 0
        self.total = 0

    def _write(self, line: dict[str, Any]) -> None:
        if self.path is not None:
            metrics.append(self.path, line)

    def start(self, step: int, total: int, per_epoch: int, resumed: int | None) -> None:
        self.step_last, self.total = step, total
        self.t0 = self.t_last = time.time()
        self._write(metrics.start_line(step, total, per_epoch, resumed))

    def epoch(self, row: dict[str, Any], step: int) -> None:
        now = time.time()
        rate = (step - self.step_last) * self.batch / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, step
        self._write(metrics.epoch_line(row, step, self.total, rate, now - self.t0))

    def end(self, step: int, early_stop: dict[str, Any] | None = None) -> None:
        self._write(metrics.end_line(step, self.total, early_stop))


class RankStatus:
    """One rank's live figures, in its status record (``dagtrain.rank_env``: the file in
    the launcher's status folder, whose failure fields the rank adds if it fails) and,
    when ``status_dir`` names another file, in ``<status_dir>/rank<N>.json`` too
    (nothing without either). ``step(seconds, samples)`` after every step costs a list
    append and the record's step, in memory; the files are rewritten at most every
    ``every`` seconds, at each ``flush()`` (an epoch's end) and by ``done()``.

    The file: ``rank``, ``host``, ``pid``, ``status`` (``running``/``done``; the
    launcher's record also ``starting``/``failed``), ``step``, ``total_steps``,
    ``steps_timed``, ``samples_per_second`` (this rank's samples over its step time,
    this try), ``median_step_ms``, ``p95_step_ms``, ``updated`` (unix), ``start_step``
    (the step this launch began at) and ``first_step_time`` (unix: when its first step
    ended; with ``prompt``, as an elastic run has, written at once: it times the
    run's recovery after a world change)."""

    def __init__(
        self, status_dir: str | None, rank: int, every: float = 2.0, prompt: bool = False
    ) -> None:
        self.own = this_rank()  # the launcher's record of this process
        self.records = [self.own]
        if status_dir is not None:
            path = record_path(status_dir, rank)
            if self.own.path is None or os.path.abspath(self.own.path) != os.path.abspath(path):
                self.records.append(
                    StatusRecord(path, rank=rank, host=socket.gethostname(), pid=os.getpid())
                )
        self.path = self.records[-1].path  # the status_dir's file, else the launcher's
        self.rank = rank
        self.every = every
        self.prompt = prompt  # write the record as the first step ends, too
        self.seconds: list[float] = []
        self.samples = 0
        self.step_now = 0
        self.total = 0
        self.last_write = 0.0

    def start(self, step: int, total: int, **placed: Any) -> None:
        """``placed``: where in the run this rank is (a pipeline's ``stage`` and
        ``replica``), kept in the records from now on."""
        self.step_now, self.total = step, total
        for r in self.records:
            r.update(start_step=step, first_step_time=None, **placed)
        self._write("running")

    def step(self, seconds: float, samples: int) -> None:
        self.seconds.append(seconds)
        self.samples += samples
        self.step_now += 1
        self.own.update(step=self.step_now)  # the step a failure record names
        if len(self.seconds) == 1 and self.prompt:  # when this launch's first step
            for r in self.records:  # ended: an elastic run's recovery ends there
                r.update(first_step_time=time.time())
            self._write("running")
        elif time.monotonic() - self.last_write >= self.every:
            self._write("running")

    def flush(self) -> None:
        self._write("running")

    def done(self) -> None:
        self._write("done")

    def figures(self) -> dict[str, Any]:
        times = sorted(self.seconds)
        med, p95 = percentile(times, 0.5), percentile(times, 0.95)
        total = sum(times)
        return {
            "steps_timed": len(times),
            "samples_per_second": self.samples / total if total > 0 else None,
            "median_step_ms": None if med is None else med * 1000,
            "p95_step_ms": None if p95 is None else p95 * 1000,
        }

    def _write(self, status: str) -> None:
        self.last_write = time.monotonic()
        for record in self.records:
            record.write(
                status=status, step=self.step_now, total_steps=self.total, **self.figures()
            )
