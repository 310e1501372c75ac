"""What the stages record of MLflow in the artifact store, and the links built from it.

``runs/<run>/mlflow.json`` (``RECORD``): the run's tracking URI, connection, experiment
and MLflow run id, and the registered model version its promote created.
``runs/<run>/mlflow-pending.json`` (``PENDING``): the logging a stage could not do (the
server was down), done first by the run's next stage. ``registry/mlflow.json``
(``REGISTRY_RECORD``): the MLflow model version of each dagtrain registry version. The
training page reads these files, never MLflow itself nor Airflow's tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dagtrain.atomic import atomic_write
from dagtrain.records.names import MLFLOW_PENDING, MLFLOW_RECORD

__all__ = [
    "PENDING",
    "RECORD",
    "REGISTRY_RECORD",
    "mlflow_links",
    "model_version_url",
    "read",
    "run_url",
    "write",
]

RECORD = REGISTRY_RECORD = MLFLOW_RECORD
PENDING = MLFLOW_PENDING


def read(path: Path) -> dict[str, Any]:
    """A record (a JSON object), or {} where there is none or it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(path: Path, data: dict[str, Any]) -> None:
    atomic_write(Path(path), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI's page of a run."""
    return f"{uri.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_id)}"


def model_version_url(uri: str, name: str, version: str | int) -> str:
    """The MLflow UI's page of a registered model version."""
    return f"{uri.rstrip('/')}/#/models/{quote(name, safe='')}/versions/{quote(str(version))}"


def mlflow_links(run_dir: Path | None, registry_dir: Path | None) -> dict[str, Any]:
    """What the training page links to: ``run`` (the MLflow run of ``run_dir``, or None)
    and ``versions`` ({dagtrain version: the MLflow model version's page}), from the
    records the stages wrote."""
    out: dict[str, Any] = {"run": None, "versions": {}}
    rec = read(run_dir / RECORD) if run_dir is not None else {}
    if _web(rec.get("uri")) and rec.get("run_id") and rec.get("experiment_id"):
        out["run"] = {
            "url": run_url(rec["uri"], rec["experiment_id"], rec["run_id"]),
            "run_id": rec["run_id"],
            "experiment": rec.get("experiment"),
            "pending": bool(read_pending(run_dir)),
        }
    reg = read(registry_dir / REGISTRY_RECORD) if registry_dir is not None else {}
    for version, mv in (reg.get("versions") or {}).items():
        if isinstance(mv, dict) and _web(reg.get("uri")) and mv.get("name") and mv.get("version"):
            out["versions"][str(version)] = {
                "url": model_version_url(reg["uri"], mv["name"], mv["version"]),
                "name": mv["name"],
                "version": str(mv["version"]),
            }
    return out


def _web(uri: Any) -> bool:
    """Only an http(s) tracking URI becomes a link on the page."""
    return isinstance(uri, str) and uri.startswith(("http://", "https://"))


def read_pending(run_dir: Path) -> list[dict[str, Any]]:
    items = read(run_dir / PENDING).get("pending")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def write_pending(run_dir: Path, items: list[dict[str, Any]]) -> None:
    path = run_dir / PENDING
    if items:
        write(path, {"pending": items})
    elif path.exists():
        path.unlink()
