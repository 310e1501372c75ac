"""The training page's FastAPI app, mounted by the api-server under ``/dagtrain``.

    GET /dagtrain/                                    the page (static HTML + JS)
    GET /dagtrain/static/{name}                       its script, style and uPlot
    GET /dagtrain/api/pipelines                       dagtrain DAGs the user may read
    GET /dagtrain/api/dags/{dag_id}/runs              their runs
    GET /dagtrain/api/dags/{dag_id}/runs/{run_id}     a run's report (``report``)
    GET /dagtrain/api/dags/{dag_id}/runs/{run_id}/progress   rank 0's progress lines
                                                      (?after=T: written after time T)
    GET /dagtrain/api/dags/{dag_id}/runs/{run_id}/trace   every rank's step trace, merged
                                                      (?step=S: an epoch's last step)
    GET /dagtrain/api/dags/{dag_id}/curves            newest runs' epochs (?limit=5)
    GET /dagtrain/api/dags/{dag_id}/registry          the pipeline's model registry

Every route requires an authenticated Airflow user (the auth manager's token, as the
UI's own requests carry it), and every ``dag_id`` route read access to that DAG
(``requires_access_dag``). What Airflow knows comes through its ORM; what the stages
wrote, from the run's artifact root only (``report``). Built on the first request
(``LazyApp``): importing the plugin, which every Airflow process does, stays cheap.
"""

# no `from __future__ import annotations`: FastAPI must see the dependencies' annotated
# types (imported inside create_app) as objects, not as names it cannot resolve
from pathlib import Path
from typing import Any

from dagtrain.records.layout import PREPARE_TASK

__all__ = ["LazyApp", "create_app"]

STATIC = Path(__file__).parent / "static"
_FILES = {  # what /static serves: these names only
    "app.js": "text/javascript",
    "app.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
TAG = "dagtrain"


class LazyApp:
    """An ASGI app that builds ``create_app()`` on its first request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)

    def __repr__(self) -> str:
        return "dagtrain.plugins.app:create_app"


def create_app():
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.common.db.common import SessionDep
    from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
    from fastapi import Depends, FastAPI, HTTPException, Query
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
    from sqlalchemy import select

    from . import report

    app = FastAPI(title="dagtrain", docs_url=None, redoc_url=None, openapi_url=None)
    read_dag = [Depends(requires_access_dag("GET"))]
    read_run = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]

    bags: list[Any] = []

    def dag_bag() -> Any:
        """One DBDagBag for the app: it keeps the DAG versions it has read (a page polls,
        and the curves and registry read up to 50 runs' DAGs)."""
        if not bags:
            from airflow.models.dagbag import DBDagBag

            bags.append(DBDagBag())
        return bags[0]

    def dag_of(dag_id: str, session: Any) -> Any:
        from airflow.models.dag import DagModel

        dag = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
        if dag is None or TAG not in {t.name for t in dag.tags}:
            raise HTTPException(404, f"no dagtrain pipeline {dag_id!r}")
        return dag

    def output_of(session: Any, dag_id: str, run_id: str, task_id: str) -> Any:
        from airflow.models.xcom import XComModel

        q = XComModel.get_many(
            run_id=run_id, key="return_value", dag_ids=dag_id, task_ids=task_id, limit=1
        )
        row = session.scalars(q).first()
        return None if row is None else XComModel.deserialize_value(row)

    def runs_of(session: Any, dag_id: str, limit: int = 50) -> list[dict[str, Any]]:
        from airflow.models.dagrun import DagRun

        rows = session.scalars(
            select(DagRun)
            .where(DagRun.dag_id == dag_id)
            .order_by(DagRun.run_after.desc())
            .limit(limit)
        )
        return [
            {
                "run_id": r.run_id,
                "state": str(r.state),
                "start": r.start_date.isoformat() if r.start_date else None,
                "end": r.end_date.isoformat() if r.end_date else None,
            }
            for r in rows
        ]

    def dag_root(session: Any, dag_id: str, run_id: str) -> Path | None:
        """The run's artifact root from its DAG version: the data Asset its
        prepare_data task emits, whose URI the dag-processor made from the DAG file's
        config. Never from an XCom, which a user who may trigger can write."""
        from airflow.models.dagrun import DagRun

        dag_run = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        )
        serialized = None if dag_run is None else dag_bag().get_dag_for_run(dag_run, session)
        if serialized is None or not serialized.has_task(PREPARE_TASK):
            return None
        return report.artifact_root(serialized.get_task(PREPARE_TASK).outlets)

    def root_of(session: Any, dag_id: str, run_id: str) -> tuple[Path, Any]:
        data = output_of(session, dag_id, run_id, PREPARE_TASK)
        root = dag_root(session, dag_id, run_id)
        if root is None or data is None:
            raise HTTPException(404, f"run {run_id!r} has no prepared data (yet)")
        return root, data

    @app.get("/", response_class=HTMLResponse)
    def page(user: GetUserDep) -> Any:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}")
    def static(name: str, user: GetUserDep) -> Any:
        if name not in _FILES:
            raise HTTPException(404, "no such file")
        sub = STATIC / ("vendor" if name.startswith("uPlot") else "") / name
        return FileResponse(sub, media_type=_FILES[name])

    @app.get("/api/pipelines")
    def pipelines(user: GetUserDep, session: SessionDep) -> list[dict[str, Any]]:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
        from airflow.models.dag import DagModel

        auth = get_auth_manager()
        readable = auth.get_authorized_dag_ids(user=user, method="GET")
        dags = session.scalars(select(DagModel).where(DagModel.dag_id.in_(readable)))

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
            for d in sorted(dags, key=lambda d: d.dag_id)
            if TAG in {t.name for t in d.tags}
        ]

    @app.get("/api/dags/{dag_id}/runs", dependencies=read_run)
    def runs(dag_id: str, session: SessionDep) -> list[dict[str, Any]]:
        dag_of(dag_id, session)
        return runs_of(session, dag_id)

    @app.get("/api/dags/{dag_id}/runs/{run_id}", dependencies=read_run)
    def run(dag_id: str, run_id: str, session: SessionDep) -> dict[str, Any]:
        from airflow.models.taskinstance import TaskInstance as TI

        dag_of(dag_id, session)
        root, data = root_of(session, dag_id, run_id)
        tis = session.scalars(select(TI).where(TI.dag_id == dag_id, TI.run_id == run_id))
        stages = [
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
        out = report.run_report(root, dag_id, run_id, stages, file_config, data)
        out["asset_events"] = asset_events(session, dag_id, run_id)
        return out

    def asset_events(session: Any, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The Asset events this run's tasks emitted (the data version, the model)."""
        from airflow.models.asset import AssetEvent

        rows = session.scalars(
            select(AssetEvent).where(
                AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id
            )
        )
        return [
            {
                "asset_id": e.asset_id,
                "name": e.asset.name,
                "uri": e.asset.uri,
                "task_id": e.source_task_id,
                "timestamp": e.timestamp.isoformat() if e.timestamp else None,
            }
            for e in rows
        ]

    @app.get("/api/dags/{dag_id}/runs/{run_id}/progress", dependencies=read_run)
    def progress(
        dag_id: str, run_id: str, session: SessionDep, after: float = Query(0.0, ge=0)
    ) -> dict[str, Any]:
        """What ``dagtrain trigger --wait`` shows as epochs end: the training tasks'
        progress lines since ``after`` (none before the data is prepared)."""
        dag_of(dag_id, session)
        prepared = output_of(session, dag_id, run_id, PREPARE_TASK) is not None
        root = dag_root(session, dag_id, run_id) if prepared else None
        return {"lines": [] if root is None else report.progress_of(root, dag_id, run_id, after)}

    @app.get("/api/dags/{dag_id}/runs/{run_id}/trace", dependencies=read_run)
    def trace(
        dag_id: str, run_id: str, session: SessionDep, step: int | None = Query(None, ge=1)
    ) -> Any:
        dag_of(dag_id, session)
        root, _ = root_of(session, dag_id, run_id)
        at = "last" if step is None else f"step{step}"
        name = f"{dag_id}-{report.run_dir_of(root, dag_id, run_id).name}-{at}-trace.json"
        try:
            merged = report.merged_trace(root, dag_id, run_id, step)
        except LookupError as e:
            raise HTTPException(404, str(e)) from None
        return JSONResponse(
            merged, headers={"Content-Disposition": f'attachment; filename="{name}"'}
        )

    @app.get("/api/dags/{dag_id}/curves", dependencies=read_run)
    def curves(
        dag_id: str, session: SessionDep, limit: int = Query(5, ge=1, le=20)
    ) -> list[dict[str, Any]]:
        """Per-epoch metrics of the pipeline's newest runs, for overlaid curves."""
        dag_of(dag_id, session)
        out: list[dict[str, Any]] = []
        for r in runs_of(session, dag_id, limit):
            root = dag_root(session, dag_id, r["run_id"])
            if root is not None:
                out += [
                    c | {"state": r["state"]} for c in report.curves_of(root, dag_id, [r["run_id"]])
                ]
        return out

    @app.get("/api/dags/{dag_id}/registry", dependencies=read_dag)
    def registry(dag_id: str, session: SessionDep) -> dict[str, Any]:
        dag_of(dag_id, session)
        for r in runs_of(session, dag_id):
            root = dag_root(session, dag_id, r["run_id"])
            if root is not None:
                return report.registry_of(root)
        return {"champion": None, "versions": []}

    @app.exception_handler(HTTPException)
    async def unauthenticated(request: Any, exc: HTTPException) -> Any:
        """A browser without an Airflow session (a page it navigates to, asking for
        HTML) goes to Airflow's login and back to the page after it, as Airflow's own
        pages do; an API client keeps the status and its JSON."""
        from fastapi.exception_handlers import http_exception_handler
        from fastapi.responses import RedirectResponse

        wants_page = "text/html" in request.headers.get("accept", "")
        if exc.status_code == 401 and request.method == "GET" and wants_page:
            from airflow.api_fastapi.app import get_auth_manager

            back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(get_auth_manager().get_url_login(next_url=back), 303)
        return await http_exception_handler(request, exc)

    @app.exception_handler(ValueError)
    def refused(request: Any, exc: ValueError) -> Any:  # a path outside the artifact root
        # the path itself stays in the api-server's log: a viewer learns no file's place
        import logging

        logging.getLogger(__name__).warning("training page refused %s: %s", request.url, exc)
        return JSONResponse(
            {"detail": "refused: a file this run names lies outside its pipeline's artifacts"},
            status_code=400,
        )

    return app
