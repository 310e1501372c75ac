"""dagtrain's AirflowPlugin, registered once: the ``airflow.plugins`` entry point.

For now it registers the plugin's name (so ``airflow plugins`` lists it next to the
provider); the training page inside the Airflow UI (a FastAPI app and an external view)
lands here. Importing it imports neither torch nor MPI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

__all__ = ["DagtrainPlugin"]


class DagtrainPlugin(AirflowPlugin):
    name = "dagtrain"
