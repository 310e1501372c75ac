"""MLflow tracking and Model Registry, optional (the ``[mlflow]`` extra).

A pipeline with a ``tracking`` section logs to the MLflow server that Airflow
connection ``tracking.connection`` points at (its host, with schema and port: the
tracking URI), read through the Task SDK when each task starts. What goes where:

- one MLflow run per Airflow DAG run, in experiment ``tracking.experiment`` (default: the
  pipeline's name), tagged ``airflow.dag_id``, ``airflow.run_id``, ``airflow.try_number``
  and ``dagtrain.page`` (the training page). Its id is kept in the run's artifact folder
  (``runs/<run>/mlflow.json``, written before any rank starts), and a try that finds no
  such file looks the run up by its two Airflow tags: every try logs into the same run;
- the train phase: the effective config (what the ranks received, ``config.json``) as
  params with dotted keys, every epoch's metrics at their step, samples/s, the rank
  count and the number of world changes; the step traces, the data manifest, the
  result and the world changes as artifacts;
- evaluate: the test metrics, in the same run;
- promote: every challenger as a version of registered model ``tracking.registered_model``
  (default: the pipeline's name), tagged with dagtrain's registry version and verdict;
  then the ``champion`` alias is set from dagtrain's registry (the registry decides, MLflow
  follows, and any version MLflow lacks is registered first), under the registry's lock.

An MLflow server that is down or refuses a call never fails a task: the phase logs one
warning naming the connection and goes on; what it could not log is kept in
``runs/<run>/mlflow-pending.json`` and done first by the next phase of the run, and the
task's XCom says how it went (``"tracking": {"ok", "connection", "uri", "error", ...}``).
Every call has a deadline: MLflow's ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` are set small for dagtrain's calls unless the
environment sets them (and unset again after each).

Importing this package imports neither mlflow nor Airflow.
"""

from __future__ import annotations

from .connection import check_tracking, require_client, tracking_uri
from .records import mlflow_links
from .tracker import Tracker

__all__ = [
    "Tracker",
    "check_tracking",
    "mlflow_links",
    "require_client",
    "tracking_uri",
]
