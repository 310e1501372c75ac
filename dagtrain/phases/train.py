"""The training phase of a pipeline: the ranks launched, the result kept beside the
checkpoints.

The ranks receive ``PipelineConfig.train_config(...)``: the pipeline's model, training,
distributed and executor sections as they are, and this run's files. Retries resume
from the artifact directory: a task's checkpoints live under
``runs/<run>/train/checkpoints`` (a shard's under its round), a path that depends only
on the DAG run and the task, so try 2 finds what try 1 wrote, and the training layer
resumes from the newest valid checkpoint there. (Airflow 3.3's task state store would
hold a pointer; the directory already is one, and it survives the metadata DB.)

Ranks on several hosts: ``distributed.hosts_connection`` names an Airflow Connection
whose ``extra`` lists them (``{"hosts": ["10.0.0.2:1", "10.0.0.3:1"], "rsh_agent":
[...], "env": {...}, "rdzv_port": 29400}``, see ``dagtrain.launch.hosts``). It is read
through Airflow's API (the Task SDK's ``BaseHook.get_connection``: the connection may
live in the metadata DB, an ``AIRFLOW_CONN_*`` variable or a secrets backend) when the
task starts, and refused, naming the connection and the key, before any rank starts.
The ranks then exchange their config and rank 0's result in the task's folder (the artifact
directory, which every host must share, as it shares the checkpoints), not in a local
temporary folder. The summary's ``placement`` says which host each rank ran on.

Beside the checkpoints: ``result.json`` (rank 0's result, with ``config``, what the
ranks received), ``config.json`` (that config alone: the run's effective config) and
``metrics.jsonl`` (rank 0's progress, a line per epoch, appended by every try).

With ``tracking`` set (MLflow, ``dagtrain.tracking``): before any rank starts, the DAG
run's MLflow run is found or created and tagged with this try; once the ranks are done,
the effective config, every epoch's metrics and the artifacts are logged to it. A
server that is down costs a warning and an entry in the run's pending file, never the
training; the summary's ``tracking`` says how it went. (A round's shard logs nothing:
the round's evaluate and promote do.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagtrain.config import DistributedConfig, PipelineConfig, TrainConfig
from dagtrain.errors import InputError
from dagtrain.rank_env import CODE_PATH
from dagtrain.records import metrics
from dagtrain.records.layout import ArtifactLayout, TrainFiles, shard_split, write_json
from dagtrain.records.result import FailureRecord, TrainSummary, write_failure, write_summary

from .prep import data_file, manifest_of

__all__ = [
    "code_path",
    "connection_hosts",
    "init_file",
    "record_try",
    "resolve_hosts",
    "resolve_init",
    "run_train",
    "train_phase",
]


def connection_hosts(conn_id: str) -> Any:
    """The Hosts that Airflow connection ``conn_id``'s extra lists, read through the Task
    SDK (inside a task: from the API server; elsewhere: ``AIRFLOW_CONN_*`` variables or
    the secrets backend). InputError naming the connection for a missing one or a bad
    extra."""
    from dagtrain.launch import from_extra

    try:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError as e:  # the training layer alone, without Airflow
        raise InputError(
            f"distributed.hosts_connection is {conn_id!r}, an Airflow connection, but "
            f"Airflow is not installed here ({e}); give distributed.hosts instead"
        ) from e
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise InputError(
            f"distributed.hosts_connection: there is no Airflow connection {conn_id!r}; "
            f"create it (`airflow connections add {conn_id} --conn-type generic "
            '--conn-extra \'{"hosts": ["host1:1", "host2:1"]}\'`, or the UI\'s Admin > '
            "Connections), or fix the name in the pipeline's file"
        ) from None
    return from_extra(conn_id, conn.extra)


def resolve_hosts(dist: DistributedConfig) -> Any:
    """The hosts of a run: the connection ``distributed.hosts_connection`` names, or
    ``distributed.hosts``, or None (one host)."""
    if dist.hosts_connection:
        return connection_hosts(dist.hosts_connection)
    return list(dist.hosts) or None


def record_try(metrics_file: str | Path, try_number: int) -> None:
    """Mark in a training task's metrics file that try ``try_number`` begins (before its
    ranks start): the ``start`` line rank 0 appends next belongs to it, and a try that
    failed before training started is still a try (the training page lists them)."""
    metrics.append(metrics_file, metrics.try_line(try_number))


def code_path(*folders: str | Path | None) -> dict[str, str]:
    """The variable that gives the ranks ``folders`` (the DAG file's, the config
    file's, Airflow's plugins folder: where a DAG author puts a model module) to import
    from, after the installed packages (``dagtrain.rank_env.CODE_PATH``); each once."""
    seen: list[str] = []
    for entry in folders:
        if entry and str(entry) not in seen:
            seen.append(str(entry))
    return {CODE_PATH: os.pathsep.join(seen)}


def train_phase(
    cfg: PipelineConfig,
    run_id: str,
    data: Any,
    *,
    try_number: int = 1,
    ranks: int | None = None,
    round: int | None = None,
    shard: int | None = None,
    timeout: float | None = None,
    log: Any = None,
    on_start: Callable[[Any], None] | None = None,
    code_dirs: tuple[str | Path | None, ...] = (),
    airflow: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The training task of DAG run ``run_id``: its ranks launched on the run's files;
    returns the summary (the task's XCom).

    ``data``: the prepare phase's output. ``ranks`` overrides ``distributed.ranks``.
    With ``round`` set, shard ``shard`` of that round: it starts from the round's
    global model, trains ``rounds.local_steps`` steps on its shard and writes its
    parameter delta (the summary's ``delta``). ``log``: a logger (the task's). A try
    that fails with a RankFailure leaves its record (``TrainFiles.failure``) for the
    training page, then the failure is raised. ``airflow``: the task's ``dag_id``,
    ``run_id`` and ``page`` (for MLflow's tags; ``dagtrain.phases.registry.tracker_of``)."""
    from dagtrain.launch import RankFailure

    from .registry import tracker_of

    run = ArtifactLayout.of(cfg).run(run_id)
    dist = cfg.distributed
    if ranks:
        dist = DistributedConfig.model_validate({**dist.model_dump(), "ranks": ranks})
    init: dict[str, Any] | None = None
    if round is None:
        manifest = manifest_of(cfg, data, ("train", "val"))
        out = run.train
        split = "train"
        # training.init resolved (the champion's file, or the author's), and checked to
        # fit this config's model, before any rank starts
        init_from, training, init = resolve_init(cfg, manifest, code_dirs, log, out.dir)
    else:
        if cfg.training.init != "scratch":  # refused by the config file's validation too
            raise InputError(
                f"training.init {cfg.training.init!r}: a rounds pipeline starts from its "
                "seeded initialisation; set training.init: scratch"
            )
        if shard is None:
            raise InputError(f"round {round}: a shard's training task needs its shard number")
        # a shard the data lacks is refused there, with the files it has
        split = shard_split(shard)
        manifest = manifest_of(cfg, data, (split, "val"))
        out = run.shard(round, shard)
        steps = cfg.rounds.local_steps  # local_steps decides, not epochs
        training = cfg.training.model_copy(
            update={"max_steps": steps, "epochs": 10**6, "checkpoint_every": steps}
        )
        init_from = str(run.global_checkpoint(round)) if round else None
    tcfg = cfg.train_config(
        distributed=dist,
        training=training,
        data=data_file(manifest, split),
        eval_data=data_file(manifest, "val"),
        init_from=init_from,
        **train_paths(out),
    )
    if tcfg.parallel.stages > 1:  # a split the model cannot have: refused before the ranks
        from dagtrain.training.rank.split import check_stages

        check_stages(tcfg, manifest)
    if log is not None:
        p = tcfg.parallel
        log.info(
            "training %s on %d %s rank(s)%s%s; checkpoints in %s",
            cfg.model.name,
            tcfg.distributed.ranks,
            tcfg.distributed.backend,
            f" (elastic: goes on with {dist.fewest_ranks} or more when ranks are lost, up "
            f"to {dist.max_world_changes} world change(s) a try"
            f"{', taking back a host that answers again' if dist.regrow else ''})"
            if dist.elastic
            else "",
            f" as {p.stages} pipeline stages x {tcfg.replicas} replica(s), "
            f"{p.microbatches} microbatches a step"
            f"{f', {p.chunks} chunks a rank' if p.chunks > 1 else ''}"
            f"{' placed in a V' if p.placement == 'v' else ''}, order {p.order}, "
            f"split {p.split}"
            if p.stages > 1
            else "",
            tcfg.checkpoint_dir,
        )
    tracker = None if round is not None else tracker_of(cfg, run_id, airflow, log)
    if tracker is not None:
        tracker.do("start", try_number=int(try_number))
    record_try(out.metrics, try_number)
    try:
        summary = run_train(
            tcfg,
            out,
            timeout=timeout,
            on_line=None if log is None else log.info,
            on_start=on_start,
            code_dirs=code_dirs,
            init=init,
        )
    except RankFailure as e:  # kept for the training page: which rank, how, its lines
        write_failure(out.failure(try_number), FailureRecord.of_failure(e))
        raise
    if log is not None and summary.get("resumed_from_step") is not None:
        log.info(
            "resumed from step %s; this try trained %s step(s), completing %s epoch(s)",
            summary["resumed_from_step"],
            summary["steps_trained_now"],
            summary["epochs_trained_now"],
        )
    if round is not None:
        from .rounds import shard_delta

        summary["delta"] = shard_delta(cfg, manifest, run, round, shard, summary["checkpoint"])
        summary["shard"] = shard
        summary["dir"] = str(out.dir)
    if tracker is not None:
        tracker.do("train", train_dir=str(out.dir), manifest=str(manifest_path(manifest)))
        summary["tracking"] = tracker.report()
    return summary


def resolve_init(
    cfg: PipelineConfig,
    manifest: dict[str, Any],
    code_dirs: tuple[str | Path | None, ...] = (),
    log: Any = None,
    keep_in: str | Path | None = None,
) -> tuple[str | None, Any, dict[str, Any]]:
    """``training.init`` of a retraining run resolved: ``(init_from, training section,
    record)``, the record the summary's ``init`` (``kind``, ``version``, ``path``,
    ``note``).

    ``champion``: the registry's champion's model file; none yet, the training section
    with ``init: scratch`` and a note. A file: resolved against the config file's folder.
    Either is checked to exist and to fit the model this config builds (InputError naming
    ``training.init``, the champion's version, the parameter and both shapes), before any
    rank starts. ``keep_in``: the task's folder; the first try's resolution is kept
    there, and a retry uses it (a champion promoted meanwhile does not change where a
    run started from)."""
    init = cfg.training.init
    kept = TrainFiles(Path(keep_in)).init if keep_in is not None else None
    record = _kept(kept, init)
    if record is None:
        record = _resolved(cfg, manifest, code_dirs)
        if kept is not None:
            write_json(kept, {"init": init, **record})
    elif log is not None:
        log.info("training.init %s: as the first try resolved it (%s)", init, _said(record))
    if record["kind"] == "scratch":
        training = (
            cfg.training
            if init == "scratch"
            else cfg.training.model_copy(update={"init": "scratch"})
        )
        if record.get("note") and log is not None:
            log.warning("%s", record["note"])
        return None, training, record
    if log is not None:
        log.info("training.init %s: starting from %s", init, _said(record))
    return record["path"], cfg.training, record


def _said(record: dict[str, Any]) -> str:
    if record["kind"] == "champion":
        return f"the champion v{record['version']} ({record['path']})"
    return str(record.get("path") or record["kind"])


def _kept(path: Path | None, init: str) -> dict[str, Any] | None:
    """The resolution an earlier try of the task kept, if it resolved the same
    ``training.init`` and its file is still there."""
    from dagtrain.records.jsonfile import read_object

    doc = read_object(path) if path is not None else {}  # unreadable: resolved again
    if doc.get("init") != init or doc.get("kind") not in ("scratch", "champion", "file"):
        return None
    if doc["kind"] != "scratch" and not Path(str(doc.get("path"))).is_file():
        return None
    return {k: doc.get(k) for k in ("kind", "version", "path", "note")}


def _resolved(
    cfg: PipelineConfig, manifest: dict[str, Any], code_dirs: tuple[str | Path | None, ...]
) -> dict[str, Any]:
    init = cfg.training.init
    if init == "scratch":
        return {"kind": "scratch", "version": None, "path": None, "note": None}
    if init == "champion":
        from .registry import champion

        champ = champion(cfg)
        if champ is None:
            return {
                "kind": "scratch",
                "version": None,
                "path": None,
                "note": "training.init champion: the registry has no champion yet; "
                "training from scratch",
            }
        path, source = Path(champ.path), f"champion v{champ.version}"
        if not path.is_file():
            raise InputError(
                f"training.init {source}: its model file {str(path)!r} is missing; restore "
                "the registry's models folder, or set training.init: scratch"
            )
        record = {"kind": "champion", "version": champ.version, "path": str(path), "note": None}
    else:
        path, source = init_file(cfg), f"file {init!r}"
        record = {"kind": "file", "version": None, "path": str(path), "note": None}
    check_init_fits(cfg, manifest, path, source, code_dirs)
    return record


def init_file(cfg: PipelineConfig) -> Path:
    """The model file ``training.init`` names, resolved against the config file's
    folder; InputError naming the field where there is none."""
    init = cfg.training.init
    path = cfg.path(init)
    if not path.is_file():
        hint = f" (did you mean {init.lower()}?)" if init.lower() in ("scratch", "champion") else ""
        raise InputError(
            f"training.init: there is no model file {str(path)!r} ({init!r} resolved "
            f"against the config file's folder){hint}; name a model file there, or set "
            "training.init: scratch or champion"
        )
    return path


def check_init_fits(
    cfg: PipelineConfig,
    manifest: dict[str, Any],
    path: str | Path,
    source: str,
    code_dirs: tuple[str | Path | None, ...] = (),
) -> None:
    """InputError naming ``training.init`` and ``source`` unless the weights in ``path``
    fit the model this config builds (built on the meta device: no memory, no
    weights; a factory that cannot be built there is built for real)."""
    import sys

    import torch

    from dagtrain.training.rank.models import DataInfo, build_model
    from dagtrain.training.rank.warmstart import check_fits, load_weights

    state = load_weights(path, read=set())  # shapes: a sharded checkpoint's unread
    info = DataInfo.of(manifest, cfg.objective.name)
    m = cfg.model
    added = [str(d) for d in code_dirs if d and str(d) not in sys.path]
    sys.path.extend(added)  # the DAG author's model module, as the ranks find it
    try:
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                model = build_model(m.name, info.in_shape, info.classes, info, **m.args)
        except InputError:
            raise
        except Exception:  # a factory that needs real tensors
            with torch.random.fork_rng(devices=[]):
                model = build_model(m.name, info.in_shape, info.classes, info, **m.args)
    finally:
        for d in added:
            sys.path.remove(d)
    check_fits(state, model, source, repr(m.name))


def manifest_path(manifest: dict[str, Any]) -> Path:
    """The manifest file of a prepared data version (``manifest_of``'s output)."""
    from dagtrain.records.layout import DataFiles

    return DataFiles(Path(manifest["dir"])).manifest


def train_paths(out: TrainFiles) -> dict[str, str]:
    """The TrainConfig fields that put a training run's files in ``out``."""
    return {
        "checkpoint_dir": str(out.checkpoints),
        "trace_dir": str(out.traces),
        "status_dir": str(out.ranks),
        "metrics_file": str(out.metrics),
    }


def run_train(
    tcfg: TrainConfig,
    out: TrainFiles,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
    code_dirs: tuple[str | Path | None, ...] = (),
    init: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Launch the ranks; write and return a summary of rank 0's TrainResult (with
    ``init``: where its initial weights came from, :func:`resolve_init`'s record).

    ``code_dirs``: folders the ranks import a DAG author's modules from, after the
    installed packages (the DAG file's, the config's, Airflow's plugins folder).
    Raises InputError before any rank starts when ``distributed.hosts_connection``
    names no connection, or one whose extra is not a host list; RankInputError (an
    InputError) when a rank refused its input."""
    from dagtrain.training import run_training

    hosts = resolve_hosts(tcfg.distributed)
    # what the ranks receive, kept before they start: a run that fails still shows it
    write_json(out.config, tcfg.model_dump(mode="json"))
    jobs: list[Any] = []

    def started(job: Any) -> None:
        jobs.append(job)
        if on_start is not None:
            on_start(job)

    res = run_training(
        tcfg,
        hosts=hosts,
        timeout=timeout,
        on_line=on_line,
        on_start=started,
        # ranks on other hosts read their config and write the result where all see it
        work_dir=out.dir if hosts else None,
        env=code_path(*code_dirs),
    )
    placement = jobs[-1].placement if jobs else {}
    summary = TrainSummary.of_result(res, placement)
    summary.init = init
    write_summary(out.result, summary)
    return summary.to_dict()
