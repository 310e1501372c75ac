"""What the phases record of MLflow in the artifact store, typed; written by
``dagtrain.tracking.Tracker`` only, read by it and by the training page's links.

- ``runs/<run>/mlflow.json`` (:class:`MlflowRun`): the run's tracking URI (as shown:
  without credentials), connection, experiment and MLflow run id, and the registered
  model version its promote created;
- ``runs/<run>/mlflow-pending.json`` (a list of :class:`Pending`): the logging a phase
  could not do (the server was down), done first by the run's next phase;
- ``registry/mlflow.json`` (:class:`MlflowModels`): the MLflow model version of each
  dagtrain registry version.

A missing or unreadable file reads as an empty record (tracking never fails a task); a
field this version does not know is kept (``extra``) and written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonfile import read_object, write_json
from .names import MLFLOW_PENDING, MLFLOW_RECORD
from .typed import from_doc, to_doc

__all__ = [
    "MlflowModels",
    "MlflowRun",
    "Pending",
    "read_models",
    "read_pending",
    "read_run",
    "write_models",
    "write_pending",
    "write_run",
]


@dataclass
class MlflowRun:
    """``runs/<run>/mlflow.json``: the DAG run's MLflow run."""

    uri: str | None = None
    connection: str | None = None
    experiment: str | None = None
    experiment_id: str | None = None
    run_id: str | None = None
    model: str | None = None  # the registered model its promote created a version of
    model_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields a newer version wrote

    def at(self, uri: str) -> str | None:
        """Its MLflow run id, where it was recorded on the server at ``uri`` (as shown)."""
        return self.run_id if self.run_id and self.uri == uri else None


@dataclass
class MlflowModels:
    """``registry/mlflow.json``: {dagtrain version: ``{"name", "version"}`` of its MLflow
    model version} on the server at ``uri``."""

    uri: str | None = None
    name: str | None = None
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pending:
    """One part a phase could not log: ``part`` (``start``, ``train``, ``evaluate``,
    ``promote``) and the arguments to do it with."""

    part: str
    args: dict[str, Any] = field(default_factory=dict)


def read_run(run_dir: Path) -> MlflowRun:
    return from_doc(MlflowRun, read_object(Path(run_dir) / MLFLOW_RECORD))


def write_run(run_dir: Path, record: MlflowRun) -> None:
    write_json(Path(run_dir) / MLFLOW_RECORD, to_doc(record))


def read_models(registry_dir: Path) -> MlflowModels:
    models = from_doc(MlflowModels, read_object(Path(registry_dir) / MLFLOW_RECORD))
    if not isinstance(models.versions, dict):
        models.versions = {}
    return models


def write_models(registry_dir: Path, record: MlflowModels) -> None:
    write_json(Path(registry_dir) / MLFLOW_RECORD, to_doc(record))


def read_pending(run_dir: Path) -> list[Pending]:
    items = read_object(Path(run_dir) / MLFLOW_PENDING).get("pending")
    if not isinstance(items, list):
        return []
    return [
        Pending(i["part"], i.get("args") or {})
        for i in items
        if isinstance(i, dict) and isinstance(i.get("part"), str)
    ]


def write_pending(run_dir: Path, items: list[Pending]) -> None:
    """Keep ``items`` (none: the file goes)."""
    path = Path(run_dir) / MLFLOW_PENDING
    if items:
        write_json(path, {"pending": [to_doc(i) for i in items]})
    elif path.exists():
        path.unlink()
