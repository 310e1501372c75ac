"""Reading a pipeline's artifact files for the training page: every path resolved and
checked to stay inside the pipeline's artifact root; a file not there yet, or being
written, reads as nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from dagtrain.records import metrics
from dagtrain.records.layout import ArtifactLayout, RunLayout, TrainFiles
from dagtrain.records.result import FailureRecord
from dagtrain.records.status import RankRecord

__all__ = [
    "artifact_root",
    "as_int",
    "inside",
    "read_json",
    "read_lines",
    "run_dir_of",
    "run_layout",
    "failure_records",
    "rank_records",
]


def artifact_root(outlets: Any) -> Path | None:
    """The pipeline's artifact root from ``prepare_data``'s outlets (its data Asset, a
    ``file://`` URI of the root's data folder: ``pipelines.data_asset``), or None."""
    for a in outlets or ():
        name, uri = getattr(a, "name", ""), getattr(a, "uri", "")
        if name.startswith("dagtrain.") and name.endswith(".data"):
            parsed = urlparse(uri)
            if parsed.scheme == "file" and parsed.path:
                return ArtifactLayout.of_data_root(unquote(parsed.path)).root
    return None


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved; ValueError when it is outside ``root``."""
    p = path.resolve()
    if not p.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the pipeline's artifact root")
    return p


def run_dir_of(root: Path, dag_id: str, run_id: str) -> Path:
    """The folder of run ``run_id`` of DAG ``dag_id``, checked to be inside the root."""
    return inside(root, ArtifactLayout(root, dag_id).run(run_id).dir)


def run_layout(root: Path, dag_id: str, run_id: str) -> RunLayout:
    """The run's layout, its folder checked to be inside the root."""
    run_dir_of(root, dag_id, run_id)
    return ArtifactLayout(root, dag_id).run(run_id)


def read_json(root: Path, path: Path) -> Any:
    """The JSON document at ``path`` (inside ``root``); None where there is none yet."""
    p = inside(root, path)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def read_lines(root: Path, path: Path) -> list[dict[str, Any]]:
    """A metrics file's whole lines (:func:`dagtrain.records.metrics.read`)."""
    return metrics.read(inside(root, path))


def rank_records(root: Path, train: TrainFiles) -> dict[int, RankRecord]:
    """Each rank's status record of a training folder, by rank (read inside ``root``)."""
    out: dict[int, RankRecord] = {}
    for f in train.rank_records().values():
        record = RankRecord.of(read_json(root, f))
        if record is not None:
            out[record.rank] = record
    return out


def failure_records(root: Path, train: TrainFiles) -> dict[int, FailureRecord]:
    """Each failed try's failure record of a training folder, by try (read inside
    ``root``)."""
    out: dict[int, FailureRecord] = {}
    for n, f in train.failures().items():
        record = FailureRecord.of(read_json(root, f))
        if record is not None:
            out[n] = record
    return out


def as_int(v: Any) -> int | None:
    """``v`` where it is an int (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None
