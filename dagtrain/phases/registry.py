"""Evaluation and the model registry (champion / challenger).

The registry lives in the artifact store, ``<root>/<pipeline>/registry/``:
``registry.json`` lists every registered version (metrics, lineage: run, config,
data manifest, source checkpoint) and names the champion; ``models/vNNNN/model.pt`` is
the model's state with a sha256 sidecar. Updates take a file lock and replace
``registry.json`` atomically, so two runs promoting at once cannot lose a version.

With ``tracking`` set, MLflow's Model Registry follows this one (``dagtrain.tracking``):
evaluate logs the test metrics to the run's MLflow run; promote registers the
challenger as a version of the MLflow registered model, then, under the registry's
lock, moves the ``champion`` alias to the version this registry names champion. The
registry here decides and never waits on MLflow: a server that is down leaves the
version registered and promoted here, a warning in the task's log and ``tracking`` in
the task's XCom saying so; the next promote repairs the alias.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError
from dagtrain.records.layout import ArtifactLayout, DataFiles
from dagtrain.records.registry import (
    Evaluation,
    Registry,
    RegistryEntry,
    read_evaluation,
    read_registry,
    write_evaluation,
    write_registry,
)

from .verdict import better, direction, metric_of

__all__ = [
    "better",
    "champion",
    "evaluate_checkpoint",
    "evaluate_phase",
    "promote",
    "promoted_in",
    "with_init",
    "tracker_of",
]


def tracker_of(
    cfg: PipelineConfig, run_id: str, airflow: dict[str, Any] | None, log: Any = None
) -> Any:
    """The MLflow Tracker of a phase of DAG run ``run_id`` (None: no ``tracking``), its
    run's pending logging done first. Raises MissingDependency (no MLflow client) and
    InputError (``tracking.connection`` names no connection) before any work."""
    if cfg.tracking is None:
        return None
    from dagtrain.tracking import Tracker

    lay = _layout(cfg)
    tracker = Tracker(
        cfg,
        lay.run(run_id).dir,
        lay.registry,
        airflow=airflow,
        run_dir_of=lambda dag_id, run_id: ArtifactLayout(lay.root, dag_id).run(run_id).dir,
        registry_lock=lay.registry_lock,
        log=log,
    )
    tracker.begin()
    return tracker


def evaluate_checkpoint(
    cfg: PipelineConfig, manifest: dict[str, Any], ckpt: str, split: str = "test"
) -> dict[str, float]:
    """Metrics of the model in checkpoint ``ckpt`` on a prepared split (``test`` or
    ``val``) by the pipeline's objective, named after the split: ``test_accuracy``,
    ``test_loss``, ... and the sums they come from (``test_correct``, ``test_units``,
    ``test_samples``)."""
    return _evaluated(cfg, manifest, ckpt, split)[0]


def directions_of(cfg: PipelineConfig) -> dict[str, str]:
    """Which way each of the objective's metrics is better: a built-in's from the
    config, the author's own from its code (imported: torch is loaded here anyway)."""
    known = cfg.objective.metrics()
    if known is not None:
        return known
    from dagtrain.training.rank.objective import objective_of

    return dict(objective_of(cfg.objective).metrics)


def _evaluated(
    cfg: PipelineConfig, manifest: dict[str, Any], ckpt: str, split: str = "test"
) -> tuple[dict[str, float], dict[str, str]]:
    """(:func:`evaluate_checkpoint`'s metrics, the objective's metrics' directions)."""
    from dagtrain.training.rank import checkpoint
    from dagtrain.training.rank.data import DataForm, load_dataset
    from dagtrain.training.rank.models import DataInfo, build_model, evaluate_samples
    from dagtrain.training.rank.objective import objective_of

    from .prep import data_file

    objective = objective_of(cfg.objective)
    form = DataForm(cfg.objective.targets, objective=cfg.objective.name)
    # a Dataset's split is read EVAL_BATCH samples at a time, never whole
    test = load_dataset(data_file(manifest, split), 0.0, 0, False, form)
    info = DataInfo.of(manifest, cfg.objective.name)
    model = build_model(cfg.model.name, info.in_shape, info.classes, info, **cfg.model.args)
    # mapped: the weights are copied into the model from the file's pages (a
    # pipeline's DCP shards are read, the model's tensors only), and the optimizer
    # state (twice the weights with Adam) never read
    model.load_state_dict(checkpoint.load(ckpt, mmap=True, optim=False)["model"])
    return evaluate_samples(model, test.train, split, objective), dict(objective.metrics)


def evaluate_phase(
    cfg: PipelineConfig,
    run_id: str,
    data: Any,
    model: Any,
    log: Any = None,
    airflow: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluate task of DAG run ``run_id``: the test metrics of ``model`` (a
    training or sync task's output, a dict with ``checkpoint``, or a checkpoint path)
    on the prepare phase's output ``data``, compared with the champion's; kept as the
    run's evaluation and returned (the task's XCom; with ``tracking``, its
    ``tracking`` says how MLflow's logging went)."""
    from .prep import manifest_of

    tracker = tracker_of(cfg, run_id, airflow, log)
    manifest = manifest_of(cfg, data, ("test",))
    ckpt = model["checkpoint"] if isinstance(model, dict) else str(model)
    if not ckpt:
        raise InputError("model: the training task returned no checkpoint")
    # a task's output names a checkpoint of this run; a path the DAG's author wrote, one
    # of the pipeline's (a registered model, say)
    ckpt = own_file(cfg, ckpt, "model", run_id if isinstance(model, dict) else None)
    metrics, directions = _evaluated(cfg, manifest, ckpt)
    champ = champion(cfg)
    ok, why = better(cfg, metrics, champ, directions)
    if log is not None:
        log.info("challenger %s: %s; %s", ckpt, metrics, why)
    evaluation = Evaluation(
        checkpoint=ckpt,
        metrics=metrics,
        champion=None if champ is None else champ.version,
        champion_metrics=None if champ is None else champ.metrics,
        better=ok,
        reason=why,
        data_version=manifest["version"],
        manifest=str(DataFiles(Path(manifest["dir"])).manifest),
        metric=metric_of(cfg, directions),
        direction=direction(cfg, directions),
    )
    path = ArtifactLayout.of(cfg).run(run_id).evaluation
    write_evaluation(path, evaluation)
    out = evaluation.to_dict()
    if tracker is not None:
        tracker.do("evaluate", evaluation=str(path))
        return out | {"tracking": tracker.report()}
    return out


def _layout(cfg: PipelineConfig) -> ArtifactLayout:
    return ArtifactLayout.of(cfg)


def own_file(cfg: PipelineConfig, path: Any, field: str, run_id: str | None = None) -> str:
    """``path`` resolved, if it lies under the pipeline's artifact root (a file-only
    field), or with ``run_id`` under that run's folder; else InputError naming ``field``.
    A task's output (an XCom, which a user who may trigger runs can rewrite) names only
    the pipeline's own files."""
    lay = _layout(cfg)
    root = (lay.run(run_id).dir if run_id is not None else lay.root).resolve()
    p = Path(str(path)).resolve()
    if not p.is_relative_to(root):
        where = (
            f"the folder of run {run_id!r}"
            if run_id is not None
            else "the pipeline's artifact root"
        )
        raise InputError(
            f"{field}: {p.name!r} is not under {where}; a phase reads only the pipeline's "
            "own files (artifacts.root), whatever a task's output says"
        )
    return str(p)


def evaluation_of(cfg: PipelineConfig, run_id: str) -> Evaluation:
    """The evaluation the evaluate task of run ``run_id`` kept in the run's folder: what
    promote registers, rather than the evaluate task's XCom."""
    evaluation = read_evaluation(_layout(cfg).run(run_id).evaluation)
    if evaluation is None:
        raise InputError(f"run {run_id!r} has no evaluation: run its evaluate task first")
    return evaluation


@contextlib.contextmanager
def registry_locked(lock_file: Path) -> Iterator[None]:
    """The registry's lock held (a file lock: across processes and hosts sharing it)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _locked(cfg: PipelineConfig) -> Iterator[Registry]:
    lay = _layout(cfg)
    with registry_locked(lay.registry_lock):
        reg = read_registry(lay.registry_file)
        yield reg
        write_registry(lay.registry_file, reg)


def champion(cfg: PipelineConfig) -> RegistryEntry | None:
    return read_registry(_layout(cfg).registry_file).champion_entry()


def promoted_in(cfg: PipelineConfig, run_id: str) -> RegistryEntry | None:
    """The registry entry that run ``run_id`` of the config's DAG promoted, or None."""
    versions = read_registry(_layout(cfg).registry_file).versions
    run = (cfg.dag_id, run_id)
    return next((v for v in versions if v.promoted and v.run() == run), None)


def finite_metrics(metrics: Any) -> dict[str, int | float]:
    """The evaluation's metrics as the registry keeps them: each a finite number, or
    InputError naming the metric (they reach promote through the evaluate task's XCom,
    which a user who may change XComs could have rewritten; nothing but a number is
    ever registered, compared or shown)."""
    import math

    if not isinstance(metrics, dict) or not metrics:
        raise InputError(f"the evaluation's metrics are {type(metrics).__name__}, not a mapping")
    out = {}
    for name, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            shown = repr(v) if len(repr(v)) <= 40 else f"{type(v).__name__} of {len(repr(v))} chars"
            raise InputError(
                f"evaluation metric {str(name)[:40]!r} is {shown}, not a finite number: the "
                "evaluate task's output was changed or is corrupt; promotion refused (run "
                "evaluate again)"
            )
        out[str(name)] = v
    return out


def with_init(cfg: PipelineConfig, lineage: dict[str, Any]) -> dict[str, Any]:
    """``lineage`` with ``init``: where the training of its run (``lineage["run_id"]``)
    started from, as the training task's summary says (``training.init``: the champion
    and its version, a file, scratch); as it is where the run has no such summary."""
    from dagtrain.records.jsonfile import read_object

    run_id = lineage.get("run_id")
    if not run_id or "init" in lineage:
        return lineage
    try:  # (read_object: {} for a summary that is not there or cannot be read)
        init = read_object(_layout(cfg).run(str(run_id)).train.result).get("init")
    except (InputError, ValueError):  # a run id that names no run folder
        return lineage
    if not isinstance(init, dict):
        return lineage
    keys = ("kind", "version", "path", "note")
    return {**lineage, "init": {k: init.get(k) for k in keys}}


def promote(
    cfg: PipelineConfig,
    ckpt: str,
    metrics: dict[str, float],
    lineage: dict[str, Any],
    log: Any = None,
    airflow: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Register the challenger; make it the champion if it is better. Returns the entry
    with ``promoted`` and ``reason`` (and, with ``tracking``, ``tracking``: how MLflow's
    registration and champion alias went; ``lineage["run_id"]`` is the DAG run, whose
    training's start, ``training.init``, the entry's ``lineage["init"]`` records)."""
    from dagtrain.training.rank import checkpoint

    metrics = finite_metrics(metrics)
    ckpt = own_file(cfg, ckpt, "checkpoint")
    run_id = lineage.get("run_id") or ""
    lineage = with_init(cfg, lineage)
    tracker = tracker_of(cfg, run_id, airflow, log)

    # verified against its checksum; mapped, not read: its tensors go from the
    # checkpoint's pages to the model file's, never held whole (a pipeline's DCP
    # shards are read: its weights are held once); its optimizer state never read
    state = checkpoint.load(ckpt, mmap=True, optim=False)["model"]
    with _locked(cfg) as reg:
        ok, why = better(cfg, metrics, reg.champion_entry(), directions_of(cfg))
        version = reg.next_version()
        model = _layout(cfg).model(version)
        meta = checkpoint.write(model, state)
        del state
        entry = RegistryEntry(
            version=version,
            path=str(model),
            sha256=meta["sha256"],
            metrics=metrics,
            lineage=lineage,
            registered_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            promoted=ok,
            reason=why,
            previous_champion=reg.champion,
        )
        reg.versions.append(entry)
        if ok:
            reg.champion = version
    if tracker is not None:  # after the registry's update: MLflow follows it
        tracker.do("promote", version=version, registry_file=str(_layout(cfg).registry_file))
        return entry.to_dict() | {"tracking": tracker.report()}
    return entry.to_dict()
