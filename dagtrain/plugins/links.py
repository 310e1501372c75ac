"""Operator extra links to the training page: "Training report" and "Trace" on the
train and evaluate tasks (Airflow's task instance view shows them as buttons).

Airflow 3 evaluates a link in the worker as the task ends and keeps it as an XCom; the
plugin registers the classes (``operator_extra_links``) so the api-server knows them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink

__all__ = ["TraceLink", "TrainingReportLink"]


def page_url(dag_id: str, run_id: str, anchor: str = "") -> str:
    """The training page of a run, under the api-server's base URL."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    query = urlencode({"dag_id": dag_id, "run_id": run_id})
    return f"{base.rstrip('/')}/dagtrain/?{query}{'#' + anchor if anchor else ''}"


class TrainingReportLink(BaseOperatorLink):
    """The run's training page: curves, ranks, sync figures, registry."""

    name = "Training report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(ti_key.dag_id, ti_key.run_id)


class TraceLink(BaseOperatorLink):
    """The run's op timeline, every rank (with the merged trace to download)."""

    name = "Trace"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(ti_key.dag_id, ti_key.run_id, "timeline")
