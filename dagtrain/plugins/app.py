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
(``requires_access_dag``). The routes are :mod:`.routes`, a router of module-level
functions; what Airflow knows comes through its ORM (:mod:`.queries`), what the stages
wrote from the run's artifact root only (:mod:`.report`). Built on the first request
(``LazyApp``): importing the plugin, which every Airflow process does, stays cheap.
"""

from typing import Any

__all__ = ["LazyApp", "create_app"]


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
    """The app: :mod:`.routes`' router, and how a refusal is answered."""
    from fastapi import FastAPI, HTTPException

    from .routes import refused, router, unauthenticated

    app = FastAPI(title="dagtrain", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)
    app.add_exception_handler(HTTPException, unauthenticated)
    app.add_exception_handler(ValueError, refused)
    return app
