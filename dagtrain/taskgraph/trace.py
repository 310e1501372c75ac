"""Chrome/Perfetto trace of a run: one lane per worker, a slice per task, flow arrows.

Open the file at https://ui.perfetto.dev or chrome://tracing. The format is the
Trace Event Format's JSON object form: complete events (``ph: "X"``) for tasks,
flow events (``ph: "s"``/``"f"``) for the dependences between tasks that ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .atomic import atomic_write

if TYPE_CHECKING:
    from .report import RunReport
    from .task import Task

__all__ = ["trace_events", "write_trace"]


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
    for i, (name, s, e, w) in enumerate(
        zip(report.names, report.starts, report.ends, report.workers_of)
    ):
        if w < 0:
            continue
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "task",
                "pid": pid,
                "tid": w,
                "ts": s * us,
                "dur": max(e - s, 0.0) * us,
                "args": {"index": i, "state": report.states[i]},
            }
        )
    if tasks is not None:
        pos = {id(t): i for i, t in enumerate(tasks)}
        flow = 0
        for i, t in enumerate(tasks):
            if report.workers_of[i] < 0:
                continue
            for s in t.succs:
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
    path: str | os.PathLike,
    report: RunReport,
    tasks: list[Task] | None = None,
    process_name: str = "taskgraph",
) -> Path:
    """Write the trace atomically (temp file, fsync, rename); return its path."""
    path = Path(path)
    doc = {
        "traceEvents": trace_events(report, tasks, process_name=process_name),
        "displayTimeUnit": "ms",
    }
    atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())
    return path
