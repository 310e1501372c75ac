"""dagtrain's AirflowPlugin, registered once: the ``airflow.plugins`` entry point.

It registers a task-instance listener (``listener``: each task's state changes as JSON
lines, which ``dagtrain run`` shows as progress); the training page inside the Airflow
UI (a FastAPI app and an external view) lands here. Importing it imports neither torch
nor MPI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from . import listener

__all__ = ["DagtrainPlugin"]


class DagtrainPlugin(AirflowPlugin):
    name = "dagtrain"
    listeners = [listener]  # noqa: RUF012 (AirflowPlugin declares it a list)
