"""The training page in headless Chromium without Airflow: playwright answers the
page's requests itself, the static files from ``dagtrain/plugins/static`` and the API
from ``dagtrain.plugins.report`` over a run folder (what ``app.py`` serves, less
Airflow's side: no task instances, no Params, no Asset events)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from dagtrain.plugins import report
from dagtrain.plugins.routes import FILES as _FILES
from dagtrain.plugins.routes import STATIC

from .pipeline_fixture import DAG

ORIGIN = "http://dagtrain.test"


def chromium() -> str | None:
    return shutil.which("chromium")


def _api(root: Path, data: dict, run_id: str, path: str, query: dict) -> Any:
    stages = [{"task_id": "train", "map_index": -1, "state": "success", "try_number": 1}]
    runs = f"api/dags/{DAG}/runs"
    if path == "api/pipelines":
        return [{"dag_id": DAG, "description": "", "runs": []}]
    if path == runs:
        return [{"run_id": run_id, "state": "success", "start": None, "end": None}]
    if path == f"{runs}/{run_id}":
        return report.run_report(root, DAG, run_id, stages, None, data) | {"asset_events": []}
    if path == f"{runs}/{run_id}/trace":
        step = query.get("step", [None])[0]
        return report.merged_trace(root, DAG, run_id, int(step) if step else None)
    if path == f"api/dags/{DAG}/curves":
        return report.curves_of(root, DAG, [run_id])
    if path == f"api/dags/{DAG}/registry":
        return report.registry_of(root)
    return None


def serve(page: Any, root: Path, data: dict, run_id: str) -> None:
    """Answer the page's requests under ORIGIN/dagtrain/ from ``root``'s files."""

    def handle(route: Any) -> None:
        url = urlsplit(route.request.url)
        path = unquote(url.path.removeprefix("/dagtrain/"))
        if path == "":
            return route.fulfill(path=str(STATIC / "index.html"), content_type="text/html")
        if (m := re.fullmatch(r"static/(.+)", path)) and m[1] in _FILES:
            sub = STATIC / ("vendor" if m[1].startswith("uPlot") else "") / m[1]
            return route.fulfill(path=str(sub), content_type=_FILES[m[1]])
        try:
            body = _api(root, data, run_id, path, parse_qs(url.query))
        except LookupError as e:
            return route.fulfill(status=404, json={"detail": str(e)})
        if body is None:
            return route.fulfill(status=404, json={"detail": f"no {path}"})
        return route.fulfill(status=200, body=json.dumps(body), content_type="application/json")

    page.route(f"{ORIGIN}/dagtrain/**", handle)


def page_url(run_id: str) -> str:
    return f"{ORIGIN}/dagtrain/?dag_id={DAG}&run_id={run_id}"
