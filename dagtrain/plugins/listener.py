"""A task-instance listener: each state change of a task, as one JSON line.

Airflow calls these hooks in the process that runs the task (its task runner), through
the plugin's ``listeners``. When ``DAGTRAIN_PROGRESS`` names a file (``dagtrain run``
sets it for the runs it starts), each event is appended there as one line, written with
a single ``write`` on an ``O_APPEND`` descriptor, so concurrent tasks never interleave:

    {"event": "running", "task_id": "train", "map_index": -1, "try_number": 2,
     "max_tries": 2, "run_id": "...", "time": 1764500000.1}

``failed`` events carry ``error`` (the exception's type and message) and ``state``
(``up_for_retry`` when Airflow will try again, else ``failed``). Without the variable the
hooks do nothing. Importing this module imports neither torch nor MPI.
"""

from __future__ import annotations

import os
import time
from typing import Any

from airflow.listeners import hookimpl

from dagtrain.atomic import append_line

__all__ = ["PROGRESS_VARIABLE"]

PROGRESS_VARIABLE = "DAGTRAIN_PROGRESS"


def _emit(event: str, ti: Any, **extra: Any) -> None:
    path = os.environ.get(PROGRESS_VARIABLE)
    if not path:
        return
    state = getattr(ti, "state", None)
    record = {
        "event": event,
        "dag_id": getattr(ti, "dag_id", None),
        "run_id": getattr(ti, "run_id", None),
        "task_id": ti.task_id,
        "map_index": getattr(ti, "map_index", -1),
        "try_number": getattr(ti, "try_number", 1),
        "max_tries": getattr(ti, "max_tries", 0),
        "state": getattr(state, "value", state),
        "time": time.time(),
        **extra,
    }
    append_line(path, record)


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    _emit("running", task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    _emit("success", task_instance)


@hookimpl
def on_task_instance_skipped(previous_state: Any, task_instance: Any) -> None:
    _emit("skipped", task_instance)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    why = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    _emit("failed", task_instance, error=None if why is None else str(why))
