"""The model registry and a run's evaluation, typed: what evaluate and promote write and
the tracker, ``dagtrain run`` and the training page read.

- ``<root>/<pipeline>/registry/registry.json`` (:class:`Registry`): every registered
  version (:class:`RegistryEntry`: its model file and checksum, metrics, lineage, the
  verdict) and the champion. Written by promote under the registry's lock
  (``dagtrain.phases.registry``), read by :func:`read_registry`.
- ``runs/<run>/eval.json`` (:class:`Evaluation`): the evaluate task's metrics and
  verdict against the champion of the time; what promote registers. Written by
  evaluate, read by :func:`read_evaluation`.

A missing file reads as an empty registry or no evaluation; one that cannot be read or
is not such a record raises, naming it (promote never rebuilds a registry from
nothing). A field this version does not know is kept (``extra``) and written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonfile import read_doc, write_json
from .typed import from_doc, to_doc

__all__ = [
    "Evaluation",
    "Registry",
    "RegistryEntry",
    "read_evaluation",
    "init_said",
    "read_registry",
    "write_evaluation",
    "write_registry",
]


@dataclass
class RegistryEntry:
    """One registered version: ``lineage`` says where it came from (``dag_id``,
    ``run_id``, the data version, the source checkpoint, the config, and ``init``:
    the weights its training started from, ``{"kind": "scratch" | "champion" |
    "file", "version", "path", "note"}``)."""

    version: int
    path: str
    sha256: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)
    registered_at: str = ""
    promoted: bool = False
    reason: str = ""
    previous_champion: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields a newer version wrote

    def init(self) -> dict[str, Any] | None:
        """Where the run that registered it started from (``lineage["init"]``: the
        training summary's ``init``), or None where it did not say."""
        got = self.lineage.get("init")
        return got if isinstance(got, dict) else None

    def run(self) -> tuple[Any, Any]:
        """``(dag_id, run_id)`` of the DAG run that registered it."""
        return self.lineage.get("dag_id"), self.lineage.get("run_id")

    def to_dict(self) -> dict[str, Any]:
        return to_doc(self)


@dataclass
class Registry:
    """``registry.json``: every version, oldest first, and the champion's number."""

    champion: int | None = None
    versions: list[RegistryEntry] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def entry(self, version: int | None) -> RegistryEntry | None:
        return next((v for v in self.versions if v.version == version), None)

    def champion_entry(self) -> RegistryEntry | None:
        return self.entry(self.champion)

    def next_version(self) -> int:
        return max((v.version for v in self.versions), default=0) + 1

    def to_dict(self) -> dict[str, Any]:
        return to_doc(self)


def init_said(init: Any) -> str | None:
    """A training's ``init`` record (a summary's, a lineage's) in a few words:
    ``champion v3``, ``file model.pt``, ``scratch``, ``scratch (no champion yet)``;
    None for no record."""
    if not isinstance(init, dict) or not init.get("kind"):
        return None
    kind = str(init["kind"])
    if kind == "champion":
        return f"champion v{init.get('version')}"
    if kind == "file":
        return f"file {Path(str(init.get('path') or '')).name}"
    return "scratch (no champion yet)" if init.get("note") else kind


def read_registry(path: Path) -> Registry:
    """The registry in ``path`` (none there: an empty one). ValueError naming the file
    and the entry for one that is not a registry."""
    doc = read_doc(path)
    if doc is None:
        return Registry()
    versions = doc.get("versions")
    if not isinstance(versions, list):
        raise ValueError(f"{path}: 'versions' is not a list; restore the file")
    entries = []
    for k, v in enumerate(versions):
        if not isinstance(v, dict) or not isinstance(v.get("version"), int) or "path" not in v:
            raise ValueError(f"{path}: versions[{k}] is not a registry entry; restore the file")
        entries.append(from_doc(RegistryEntry, v))
    reg = from_doc(Registry, doc | {"versions": []})
    reg.versions = entries
    return reg


def write_registry(path: Path, registry: Registry) -> None:
    write_json(Path(path), registry.to_dict())


@dataclass
class Evaluation:
    """``eval.json``: a challenger's test metrics and the verdict against the champion
    (``champion``: its version, None when there was none)."""

    checkpoint: str
    metrics: dict[str, float] = field(default_factory=dict)
    champion: int | None = None
    champion_metrics: dict[str, float] | None = None
    better: bool = False
    reason: str = ""
    data_version: str | None = None
    manifest: str | None = None
    metric: str | None = None  # the metric that decided (``PipelineConfig.promotion_metric``)
    direction: str | None = None  # ``max`` or ``min``: which way it is better

    def to_dict(self) -> dict[str, Any]:
        return to_doc(self)


def read_evaluation(path: Path) -> Evaluation | None:
    """The evaluation in ``path``; None where there is none. ValueError naming the file
    for one that is not an evaluation."""
    doc = read_doc(path)
    if doc is None:
        return None
    if not isinstance(doc.get("checkpoint"), str):
        raise ValueError(f"{path}: not an evaluation (no checkpoint); run evaluate again")
    return from_doc(Evaluation, doc)


def write_evaluation(path: Path, evaluation: Evaluation) -> None:
    write_json(Path(path), evaluation.to_dict())
