"""Where a pipeline's MLflow server is, and whether its client is installed here:
checked before any work starts (the operators, ``dagtrain run``) and by the tracker."""

from __future__ import annotations

import importlib.util
import sys

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError, MissingDependency

__all__ = ["INSTALL", "check_tracking", "require_client", "tracking_uri"]

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
