"""MLflow tracking and Model Registry, optional (the ``[mlflow]`` extra).

A pipeline with a ``tracking`` section logs to the MLflow server that Airflow
connection ``tracking.connection`` points at (its host, with schema and port: the
tracking URI), read through the Task SDK when each task starts. What goes where:

- one MLflow run per Airflow DAG run, in experiment ``tracking.experiment`` (default: the
  pipeline's name), tagged ``airflow.dag_id``, ``airflow.run_id``, ``airflow.try_number``
  and ``dagtrain.page`` (the training page). Its id is kept in the run's artifact folder
  (``runs/<run>/mlflow.json``, written before any rank starts), and a try that finds no
  such file looks the run up by its two Airflow tags: every try logs into the same run;
- the train stage: the effective config (what the ranks received, ``config.json``) as
  params with dotted keys, every epoch's metrics at their step, samples/s, the rank
  count and the number of world changes; the step traces, the data manifest, the
  result and the world changes as artifacts;
- evaluate: the test metrics, in the same run;
- promote: every challenger as a version of registered model ``tracking.registered_model``
  (default: the pipeline's name), tagged with dagtrain's registry version and verdict;
  then the ``champion`` alias is set from dagtrain's registry (the registry decides, MLflow
  follows, and any version MLflow lacks is registered first), under the registry's lock.

An MLflow server that is down or refuses a call never fails a task: the stage logs one
warning naming the connection and goes on; what it could not log is kept in
``runs/<run>/mlflow-pending.json`` and done first by the next stage of the run, and the
task's XCom says how it went (``"tracking": {"ok", "connection", "uri", "error", ...}``).
Every call has a deadline: MLflow's ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` are set small for dagtrain's calls unless the
environment sets them (and unset again after each).

Importing this package imports neither mlflow nor Airflow.
"""

from __future__ import annotations

import importlib.util
import sys

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError, MissingDependency

from .records import PENDING, RECORD, REGISTRY_RECORD, mlflow_links
from .tracker import Tracker

__all__ = [
    "PENDING",
    "RECORD",
    "REGISTRY_RECORD",
    "Tracker",
    "check_tracking",
    "mlflow_links",
    "require_client",
    "tracking_uri",
]

INSTALL = "pip install 'airflow-provider-dagtrain[mlflow]'"


def require_client(cfg: PipelineConfig) -> None:
    """MissingDependency, saying what to install, when ``cfg`` asks for MLflow tracking
    and the client is not installed here."""
    if cfg.tracking is not None and importlib.util.find_spec("mlflow") is None:
        raise MissingDependency(
            f"tracking: the pipeline logs to MLflow (connection "
            f"{cfg.tracking.connection!r}), but the MLflow client is not installed in "
            f"this environment ({sys.prefix}); {INSTALL} (or pip install mlflow-skinny), "
            "or remove the tracking section from the pipeline's file"
        )


def tracking_uri(conn_id: str) -> str:
    """The tracking URI of Airflow connection ``conn_id``: its host, with its schema and
    port when it has them (``http://mlflow:5000``). Read through the Task SDK (inside a
    task: from the API server; elsewhere: ``AIRFLOW_CONN_*`` variables or the secrets
    backend). InputError naming ``tracking.connection`` for a missing connection or one
    without a host."""
    try:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError as e:
        raise InputError(
            f"tracking.connection is {conn_id!r}, an Airflow connection, but Airflow is "
            f"not installed here ({e})"
        ) from e
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise InputError(
            f"tracking.connection: there is no Airflow connection {conn_id!r}; create it "
            f"(`airflow connections add {conn_id} --conn-type http --conn-host "
            f"http://mlflow:5000`, or AIRFLOW_CONN_{conn_id.upper()}='http://mlflow:5000'), "
            "or fix the name in the pipeline's file"
        ) from None
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise InputError(
            f"tracking.connection: Airflow connection {conn_id!r} has no host; set it to "
            "the MLflow server's address (http://mlflow:5000)"
        )
    if "://" not in host:  # the schema field (the HTTP hook's way), else the type's
        web = [s for s in (conn.schema, conn.conn_type) if s in ("http", "https")]
        host = f"{web[0] if web else ('https' if conn.port == 443 else 'http')}://{host}"
    if conn.port and host.count(":") < 2:
        host = f"{host}:{conn.port}"
    return host


def check_tracking(cfg: PipelineConfig) -> str | None:
    """The tracking URI of ``cfg`` (None: no tracking), after checking that the client
    is installed (MissingDependency) and the connection exists (InputError)."""
    if cfg.tracking is None:
        return None
    require_client(cfg)
    return tracking_uri(cfg.tracking.connection)
