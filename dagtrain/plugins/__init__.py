"""dagtrain's AirflowPlugin, registered once: the ``airflow.plugins`` entry point.

It registers a task-instance listener (``listener``: each task's state changes as JSON
lines, which ``dagtrain run`` shows as progress) and the training page inside the
Airflow UI: a FastAPI app under ``/dagtrain`` (``app``, built on its first request) and
external views that show it in the UI's navigation ("Training") and as a tab of every
DAG run and task instance, and the "Training report" and "Trace" extra links of the
train and evaluate tasks (``links``). Importing it imports neither torch, MPI nor
FastAPI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from . import listener
from .app import LazyApp
from .links import TraceLink, TrainingReportLink

__all__ = ["DagtrainPlugin"]


class DagtrainPlugin(AirflowPlugin):
    name = "dagtrain"
    # AirflowPlugin declares these as class-level lists
    listeners = [listener]  # noqa: RUF012
    # the classes of the train and evaluate tasks' extra links, for the api-server
    operator_extra_links = [TrainingReportLink(), TraceLink()]  # noqa: RUF012
    fastapi_apps = [{"app": LazyApp(), "url_prefix": "/dagtrain", "name": "dagtrain"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "Training",
            "href": "/dagtrain/",
            "destination": "nav",
            "url_route": "dagtrain",
            "category": "browse",
        },
        {
            "name": "Training",
            "href": "/dagtrain/?dag_id={DAG_ID}&run_id={RUN_ID}",
            "destination": "dag_run",
            "url_route": "dagtrain_run",
        },
        {
            "name": "Training",
            "href": "/dagtrain/?dag_id={DAG_ID}&run_id={RUN_ID}&task_id={TASK_ID}",
            "destination": "task_instance",
            "url_route": "dagtrain_task",
        },
    ]
