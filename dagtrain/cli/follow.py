"""A DAG run followed through Airflow's REST API, for ``dagtrain trigger --wait``: the
same task and epoch lines as ``dagtrain run`` shows (``progress.Display``), from what
a remote client can read.

- Tasks: the run's task instances (``GET .../taskInstances``), polled; each change of
  a task instance's state or try becomes the event the plugin's listener would have
  written (``running``, ``success``, ``skipped``, ``failed`` with ``up_for_retry``), a
  failed try's error read from its log as the API serves it. A try that started and
  ended between two polls still gets both events.
- Epochs: rank 0's progress lines of the training tasks, from the dagtrain plugin's
  ``GET /dagtrain/api/dags/{dag_id}/runs/{run_id}/progress?after=T`` (an Airflow
  without the plugin: tasks only).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .progress import dag_order, label_of
from .rest import Client

__all__ = ["RestFollower", "task_order", "unix_seconds"]

_ENDED = {"success": "success", "skipped": "skipped", "failed": "failed", "up_for_retry": "failed"}


def task_order(tasks: list[dict[str, Any]]) -> list[str]:
    """The DAG's tasks (as ``GET /api/v2/dags/{id}/tasks`` lists them), upstream first,
    ties by id; mapped tasks left out (their instances are named as they appear)."""
    order = dag_order({t["task_id"]: t.get("downstream_task_ids") or () for t in tasks})
    mapped = {t["task_id"] for t in tasks if t.get("is_mapped")}
    return [t for t in order if t not in mapped]


def unix_seconds(value: Any) -> float | None:
    """An ISO 8601 time (the REST API's, `Z` or an offset) as unix seconds; None: none."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RestFollower:
    """What is new in a run since the last ``poll()``: (the run, events, metrics)."""

    def __init__(self, client: Client, dag_id: str, run_id: str) -> None:
        self.client = client
        self.dag_id = dag_id
        self.run_id = run_id
        self.seen: dict[str, tuple[str, int]] = {}  # label -> (state, try) last seen
        self.after = 0.0  # the newest progress line's time
        self.plugin = True  # the server serves the dagtrain plugin's progress

    def poll(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple[str, dict]]]:
        run = self.client.run(self.dag_id, self.run_id)
        events: list[dict[str, Any]] = []
        for ti in self.client.task_instances(self.dag_id, self.run_id):
            events += self._changes(ti)
        return run, events, self._metrics()

    def states(self) -> dict[str, tuple[str, int]]:
        return dict(self.seen)

    def _changes(self, ti: dict[str, Any]) -> list[dict[str, Any]]:
        index = ti.get("map_index", -1)
        label = ti["task_id"] if index is None or index < 0 else f"{ti['task_id']}[{index}]"
        state, n = str(ti.get("state")), int(ti.get("try_number") or 0)
        before = self.seen.get(label)
        if before == (state, n) or n == 0:
            return []
        self.seen[label] = (state, n)

        def event(kind: str, try_number: int, when: Any, **extra: Any) -> dict[str, Any]:
            return {
                "event": kind,
                "task_id": ti["task_id"],
                "map_index": index,
                "try_number": try_number,
                "time": unix_seconds(when),
                **extra,
            }

        def failed(try_number: int, how: str, when: Any) -> dict[str, Any]:
            why = self.client.error_of(self.dag_id, self.run_id, {**ti, "try_number": try_number})
            return event("failed", try_number, when, state=how, error=why)

        out: list[dict[str, Any]] = []
        if before is not None and before[1] < n and before[0] == "running":
            out.append(failed(before[1], "up_for_retry", None))  # retried between two polls
        started = ti.get("start_date") is not None  # a task skipped unstarted: no start
        if state == "running" or (state in _ENDED and started and before != ("running", n)):
            out.append(event("running", n, ti.get("start_date")))
        if state in _ENDED:
            kind = _ENDED[state]
            when = ti.get("end_date")
            out.append(failed(n, state, when) if kind == "failed" else event(kind, n, when))
        return out

    def _metrics(self) -> list[tuple[str, dict]]:
        if not self.plugin:
            return []
        lines = self.client.progress(self.dag_id, self.run_id, self.after)
        if lines is None:
            self.plugin = False
            return []
        if lines:
            self.after = max(self.after, *(float(m.get("time") or 0) for m in lines))
        return [(label_of(m.get("file") or ""), m) for m in lines]
