"""Chrome/Perfetto trace of a run: one lane per worker, a slice per task, flow arrows.

Open the file at https://ui.perfetto.dev or chrome://tracing. The format is the
Trace Event Format's JSON object form: complete events (``ph: "X"``) for tasks,
flow events (``ph: "s"``/``"f"``) for the dependences between tasks that ran; a task's
``args.after`` lists the indices of the tasks it waited for.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dagtrain.atomic import atomic_write

if TYPE_CHECKING:
    from .report import RunReport
    from .task import Task

__all__ = ["TraceFile", "trace_events", "write_trace"]


@dataclass(frozen=True)
class TraceFile:
    """Where ``run(trace=...)`` writes, and as which process the trace shows: traces of
    several processes (e.g. ``pid`` = rank, ``process_name`` = ``"rank 1"``) opened
    together in Perfetto appear as separate processes. A plain path is
    ``TraceFile(path)``."""

    path: str | os.PathLike
    pid: int = 1
    process_name: str = "taskgraph"


def trace_events(
    report: RunReport,
    tasks: list[Task] | None = None,
    pid: int = 1,
    process_name: str = "taskgraph",
) -> list[dict]:
    """The trace events of a run; ``tasks`` (same order as the report) adds the arrows."""
    us = 1e6
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process_name}}
    ]
    for w in range(report.workers):
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": w,
                "args": {"name": "caller" if w == 0 else f"worker {w}"},
            }
        )
    preds: list[list[int]] = [[] for _ in report.names]
    if tasks is not None:  # each slice names the slices it depended on (critical paths)
        where = {id(t): i for i, t in enumerate(tasks)}
        for i, t in enumerate(tasks):
            for s in t:  # (its successors)
                j = where.get(id(s))
                if j is not None:
                    preds[j].append(i)
    for i, (name, s, e, w) in enumerate(
        zip(report.names, report.starts, report.ends, report.workers_of)
    ):
        if w < 0:
            continue
        args: dict = {"index": i, "state": report.states[i]}
        if preds[i]:
            args["after"] = preds[i]
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "task",
                "pid": pid,
                "tid": w,
                "ts": s * us,
                "dur": max(e - s, 0.0) * us,
                "args": args,
            }
        )
    if tasks is not None:
        pos = {id(t): i for i, t in enumerate(tasks)}
        flow = 0
        for i, t in enumerate(tasks):
            if report.workers_of[i] < 0:
                continue
            for s in t:  # (its successors)
                j = pos.get(id(s))
                if j is None or report.workers_of[j] < 0:
                    continue
                flow += 1
                events.append(
                    {
                        "ph": "s",
                        "id": flow,
                        "name": "dep",
                        "cat": "dep",
                        "pid": pid,
                        "tid": report.workers_of[i],
                        "ts": report.ends[i] * us,
                    }
                )
                events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "id": flow,
                        "name": "dep",
                        "cat": "dep",
                        "pid": pid,
                        "tid": report.workers_of[j],
                        "ts": report.starts[j] * us,
                    }
                )
    return events


def write_trace(
    path: str | os.PathLike | TraceFile,
    report: RunReport,
    tasks: list[Task] | None = None,
    process_name: str = "taskgraph",
) -> Path:
    """Write the trace atomically (temp file, fsync, rename); return its path."""
    target = path if isinstance(path, TraceFile) else TraceFile(path, 1, process_name)
    path = Path(target.path)
    doc = {
        "traceEvents": trace_events(report, tasks, target.pid, target.process_name),
        "displayTimeUnit": "ms",
    }
    atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())
    return path
