"""The training page's links to MLflow: a run's MLflow run and each registry version's
MLflow model version, from what the phases recorded in the artifact store
(``dagtrain.tracking.records``), never from MLflow or Airflow's tables. No mlflow here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagtrain.records.layout import ArtifactLayout
from dagtrain.tracking import mlflow_links

__all__ = ["run_link", "version_links"]


def run_link(root: Path, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """``{"url", "run_id", "experiment", "pending"}`` of the MLflow run of run ``run_id``
    of DAG ``dag_id`` (``pending``: some logging still waits for the server), or None."""
    return mlflow_links(ArtifactLayout(root, dag_id).run(run_id).dir, None)["run"]


def version_links(root: Path) -> dict[str, dict[str, Any]]:
    """{dagtrain registry version: ``{"url", "name", "version"}`` of its MLflow model
    version}."""
    return mlflow_links(None, ArtifactLayout(root).registry)["versions"]
