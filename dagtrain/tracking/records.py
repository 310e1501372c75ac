"""Links to MLflow built from what the phases recorded of it in the artifact store
(:mod:`dagtrain.records.mlflow`: the records themselves, typed). The training page reads
these files, never MLflow itself nor Airflow's tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from dagtrain.records.mlflow import read_models, read_pending, read_run

__all__ = ["mlflow_links", "model_version_url", "run_url"]


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI's page of a run."""
    return f"{uri.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_id)}"


def model_version_url(uri: str, name: str, version: str | int) -> str:
    """The MLflow UI's page of a registered model version."""
    return f"{uri.rstrip('/')}/#/models/{quote(name, safe='')}/versions/{quote(str(version))}"


def mlflow_links(run_dir: Path | None, registry_dir: Path | None) -> dict[str, Any]:
    """What the training page links to: ``run`` (the MLflow run of ``run_dir``, or None)
    and ``versions`` ({dagtrain version: the MLflow model version's page}), from the
    records the phases wrote."""
    out: dict[str, Any] = {"run": None, "versions": {}}
    rec = read_run(run_dir) if run_dir is not None else None
    if rec is not None and _web(rec.uri) and rec.run_id and rec.experiment_id:
        out["run"] = {
            "url": run_url(rec.uri, rec.experiment_id, rec.run_id),
            "run_id": rec.run_id,
            "experiment": rec.experiment,
            "pending": bool(read_pending(run_dir)),
        }
    reg = read_models(registry_dir) if registry_dir is not None else None
    for version, mv in (reg.versions if reg is not None else {}).items():
        if isinstance(mv, dict) and _web(reg.uri) and mv.get("name") and mv.get("version"):
            out["versions"][str(version)] = {
                "url": model_version_url(reg.uri, mv["name"], mv["version"]),
                "name": mv["name"],
                "version": str(mv["version"]),
            }
    return out


def _web(uri: Any) -> bool:
    """Only an http(s) tracking URI becomes a link on the page."""
    return isinstance(uri, str) and uri.startswith(("http://", "https://"))
