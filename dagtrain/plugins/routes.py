"""The training page's routes (``app.create_app`` mounts them; see ``app`` for the
list). Each route reads what Airflow knows through :mod:`.queries` and what the phases
wrote through :mod:`.report`, from the run's artifact root only. Imported on the page's
first request, not with the plugin.
"""

# no `from __future__ import annotations`: FastAPI must see the dependencies' annotated
# types as objects, not as names it cannot resolve
from pathlib import Path
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from dagtrain.records.layout import PREPARE_TASK

from . import queries, report

__all__ = ["FILES", "STATIC", "TAG", "refused", "router", "unauthenticated"]

STATIC = Path(__file__).parent / "static"
FILES = {  # what /static serves: these names only
    "app.js": "text/javascript",
    "app.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
TAG = "dagtrain"  # the tag of the DAGs the page shows

router = APIRouter()
READ_DAG = [Depends(requires_access_dag("GET"))]
READ_RUN = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]
_BAGS: list[Any] = []


def dag_bag() -> Any:
    """One DBDagBag for the app: it keeps the DAG versions it has read (a page polls,
    and the curves and registry read up to 50 runs' DAGs)."""
    if not _BAGS:
        from airflow.models.dagbag import DBDagBag

        _BAGS.append(DBDagBag())
    return _BAGS[0]


def pipeline_dag(session: Any, dag_id: str) -> Any:
    """The dagtrain DAG ``dag_id``; 404 where it is none."""
    found = queries.tagged_dags(session, dag_id, TAG)
    if not found:
        raise HTTPException(404, f"no dagtrain pipeline {dag_id!r}")
    return found[0]


def runs_of(session: Any, dag_id: str, limit: int = 50) -> list[dict[str, Any]]:
    return [
        {
            "run_id": r.run_id,
            "state": str(r.state),
            "start": r.start_date.isoformat() if r.start_date else None,
            "end": r.end_date.isoformat() if r.end_date else None,
        }
        for r in queries.recent_runs(session, dag_id, limit)
    ]


def dag_root(session: Any, dag_id: str, run_id: str) -> Path | None:
    """The run's artifact root from its DAG version: the data Asset its prepare_data
    task emits, whose URI the dag-processor made from the DAG file's config. Never from
    an XCom, which a user who may trigger can write."""
    dag_run = queries.dag_run(session, dag_id, run_id)
    serialized = None if dag_run is None else dag_bag().get_dag_for_run(dag_run, session)
    if serialized is None or not serialized.has_task(PREPARE_TASK):
        return None
    return report.artifact_root(serialized.get_task(PREPARE_TASK).outlets)


def root_of(session: Any, dag_id: str, run_id: str) -> tuple[Path, Any]:
    """The run's artifact root and its prepare_data XCom; 404 before the data is
    prepared."""
    data = queries.return_value(session, dag_id, run_id, PREPARE_TASK)
    root = dag_root(session, dag_id, run_id)
    if root is None or data is None:
        raise HTTPException(404, f"run {run_id!r} has no prepared data (yet)")
    return root, data


@router.get("/", response_class=HTMLResponse)
def page(user: GetUserDep) -> Any:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/static/{name}")
def static(name: str, user: GetUserDep) -> Any:
    if name not in FILES:
        raise HTTPException(404, "no such file")
    sub = STATIC / ("vendor" if name.startswith("uPlot") else "") / name
    return FileResponse(sub, media_type=FILES[name])


@router.get("/api/pipelines")
def pipelines(user: GetUserDep, session: SessionDep) -> list[dict[str, Any]]:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    auth = get_auth_manager()
    readable = auth.get_authorized_dag_ids(user=user, method="GET")

    def may_read_runs(dag_id: str) -> bool:  # as the runs' own route requires
        return auth.is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=dag_id),
            user=user,
        )

    return [
        {
            "dag_id": d.dag_id,
            "description": d.description,
            "runs": runs_of(session, d.dag_id, 5) if may_read_runs(d.dag_id) else [],
        }
        for d in queries.tagged_dags(session, readable, TAG)
    ]


@router.get("/api/dags/{dag_id}/runs", dependencies=READ_RUN)
def runs(dag_id: str, session: SessionDep) -> list[dict[str, Any]]:
    pipeline_dag(session, dag_id)
    return runs_of(session, dag_id)


@router.get("/api/dags/{dag_id}/runs/{run_id}", dependencies=READ_RUN)
def run(dag_id: str, run_id: str, session: SessionDep) -> dict[str, Any]:
    pipeline_dag(session, dag_id)
    root, data = root_of(session, dag_id, run_id)
    tis = queries.task_instances(session, dag_id, run_id)
    tasks = [
        {
            "task_id": t.task_id,
            "map_index": t.map_index,
            "state": None if t.state is None else str(t.state),
            "try_number": t.try_number,
            "duration": t.duration,
        }
        for t in sorted(tis, key=lambda t: (t.start_date is None, t.start_date, t.map_index))
    ]
    serialized = dag_bag().get_latest_version_of_dag(dag_id, session=session)
    file_config = None if serialized is None else serialized.params.dump()
    out = report.run_report(root, dag_id, run_id, tasks, file_config, data)
    out["asset_events"] = queries.asset_events(session, dag_id, run_id)
    return out


@router.get("/api/dags/{dag_id}/runs/{run_id}/progress", dependencies=READ_RUN)
def progress(
    dag_id: str, run_id: str, session: SessionDep, after: float = Query(0.0, ge=0)
) -> dict[str, Any]:
    """What ``dagtrain trigger --wait`` shows as epochs end: the training tasks'
    progress lines since ``after`` (none before the data is prepared)."""
    pipeline_dag(session, dag_id)
    prepared = queries.return_value(session, dag_id, run_id, PREPARE_TASK) is not None
    root = dag_root(session, dag_id, run_id) if prepared else None
    return {"lines": [] if root is None else report.progress_of(root, dag_id, run_id, after)}


@router.get("/api/dags/{dag_id}/runs/{run_id}/trace", dependencies=READ_RUN)
def trace(
    dag_id: str, run_id: str, session: SessionDep, step: int | None = Query(None, ge=1)
) -> Any:
    pipeline_dag(session, dag_id)
    root, _ = root_of(session, dag_id, run_id)
    at = "last" if step is None else f"step{step}"
    name = f"{dag_id}-{report.run_dir_of(root, dag_id, run_id).name}-{at}-trace.json"
    try:
        merged = report.merged_trace(root, dag_id, run_id, step)
    except LookupError as e:
        raise HTTPException(404, str(e)) from None
    return JSONResponse(merged, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/api/dags/{dag_id}/curves", dependencies=READ_RUN)
def curves(
    dag_id: str, session: SessionDep, limit: int = Query(5, ge=1, le=20)
) -> list[dict[str, Any]]:
    """Per-epoch metrics of the pipeline's newest runs, for overlaid curves."""
    pipeline_dag(session, dag_id)
    out: list[dict[str, Any]] = []
    for r in runs_of(session, dag_id, limit):
        root = dag_root(session, dag_id, r["run_id"])
        if root is not None:
            out += [
                c | {"state": r["state"]} for c in report.curves_of(root, dag_id, [r["run_id"]])
            ]
    return out


@router.get("/api/dags/{dag_id}/registry", dependencies=READ_DAG)
def registry(dag_id: str, session: SessionDep) -> dict[str, Any]:
    pipeline_dag(session, dag_id)
    for r in runs_of(session, dag_id):
        root = dag_root(session, dag_id, r["run_id"])
        if root is not None:
            return report.registry_of(root)
    return {"champion": None, "versions": []}


async def unauthenticated(request: Any, exc: HTTPException) -> Any:
    """A browser without an Airflow session (a page it navigates to, asking for HTML)
    goes to Airflow's login and back to the page after it, as Airflow's own pages do;
    an API client keeps the status and its JSON."""
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.responses import RedirectResponse

    wants_page = "text/html" in request.headers.get("accept", "")
    if exc.status_code == 401 and request.method == "GET" and wants_page:
        from airflow.api_fastapi.app import get_auth_manager

        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(get_auth_manager().get_url_login(next_url=back), 303)
    return await http_exception_handler(request, exc)


def refused(request: Any, exc: ValueError) -> Any:
    """A path outside the artifact root: 400, the path itself only in the api-server's
    log (a viewer learns no file's place)."""
    import logging

    logging.getLogger(__name__).warning("training page refused %s: %s", request.url, exc)
    return JSONResponse(
        {"detail": "refused: a file this run names lies outside its pipeline's artifacts"},
        status_code=400,
    )
