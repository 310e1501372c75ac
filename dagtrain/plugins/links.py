"""Operator extra links to the training page: "Training report" and "Trace" on the
train and evaluate tasks (Airflow's task instance view shows them as buttons).

Airflow 3 evaluates a link in the worker as the task ends and keeps it as an XCom; the
plugin registers the classes (``operator_extra_links``) so the api-server knows them.
The link is the page's path on the web UI's server (``/dagtrain/?...``, under the path
of ``[api] base_url`` when it has one), with no scheme, host or port: the browser takes
them from the UI it is on, so the link leads to the page from whichever server shows
it (the api-server `dagtrain run` started, and stopped, had a port of its own).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

__all__ = ["TraceLink", "TrainingReportLink"]


def page_url(dag_id: str, run_id: str, anchor: str = "", absolute: bool = True) -> str:
    """The training page of a run under the web UI's base URL (``[api] base_url``;
    ``dagtrain run`` and ``up`` set it to the home's UI); ``absolute=False``: its path
    alone, for a link the UI shows."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    if not absolute:
        base = urlsplit(base).path.rstrip("/")
    query = urlencode({"dag_id": dag_id, "run_id": run_id})
    return f"{base}/dagtrain/?{query}{'#' + anchor if anchor else ''}"


class TrainingReportLink(BaseOperatorLink):
    """The run's training page: curves, ranks, sync figures, registry."""

    name = "Training report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(ti_key.dag_id, ti_key.run_id, absolute=False)


class TraceLink(BaseOperatorLink):
    """The run's op timeline, every rank (with the merged trace to download)."""

    name = "Trace"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(ti_key.dag_id, ti_key.run_id, "timeline", absolute=False)
