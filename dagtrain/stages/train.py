"""The training stage of a pipeline: the ranks launched, the result kept beside the
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
The ranks then exchange their config and rank 0's result in ``out_dir`` (the artifact
directory, which every host must share, as it shares the checkpoints), not in a local
temporary folder. The summary's ``placement`` says which host each rank ran on.

Beside the checkpoints: ``result.json`` (rank 0's result, with ``config``, what the
ranks received), ``config.json`` (that config alone: the run's effective config) and
``metrics.jsonl`` (rank 0's progress, a line per epoch, appended by every try).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dagtrain.config import DistributedConfig, TrainConfig
from dagtrain.errors import InputError
from dagtrain.rank_env import CODE_PATH

from .files import append_json_line, write_json

__all__ = ["code_path", "connection_hosts", "record_try", "resolve_hosts", "run_train"]


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
        ) from None
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
    Path(metrics_file).parent.mkdir(parents=True, exist_ok=True)
    append_json_line(metrics_file, {"kind": "try", "try": int(try_number), "time": time.time()})


def code_path(*folders: str | Path | None) -> dict[str, str]:
    """The variable that gives the ranks ``folders`` (the DAG file's, the config
    file's, Airflow's plugins folder: where a DAG author puts a model module) to import
    from, after the installed packages (``dagtrain.rank_env.CODE_PATH``); each once."""
    seen: list[str] = []
    for entry in folders:
        if entry and str(entry) not in seen:
            seen.append(str(entry))
    return {CODE_PATH: os.pathsep.join(seen)}


def run_train(
    tcfg: TrainConfig,
    out_dir: Path,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
    code_dirs: tuple[str | Path | None, ...] = (),
) -> dict[str, Any]:
    """Launch the ranks; write and return a summary of rank 0's TrainResult.

    ``code_dirs``: folders the ranks import a DAG author's modules from, after the
    installed packages (the DAG file's, the config's, Airflow's plugins folder).
    Raises InputError before any rank starts when ``distributed.hosts_connection``
    names no connection, or one whose extra is not a host list; RankInputError (an
    InputError) when a rank refused its input."""
    from dagtrain.training import run_training

    hosts = resolve_hosts(tcfg.distributed)
    # what the ranks receive, kept before they start: a run that fails still shows it
    write_json(out_dir / "config.json", tcfg.model_dump(mode="json"))
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
        work_dir=out_dir if hosts else None,
        env=code_path(*code_dirs),
    )
    times = sorted(res.step_seconds)
    summary = {k: v for k, v in asdict(res).items() if k != "step_seconds"} | {
        "val_accuracy": res.val_accuracy,  # eval_data: the prepared validation split
        "median_step_seconds": times[len(times) // 2] if times else None,
        # what this try did itself: a resume mid-epoch trains the rest of that epoch, so
        # steps_trained_now > 0 with epochs_trained_now == 0 is work done, not lost
        "epochs_trained_now": len(res.epochs) - res.resumed_epochs,
        "steps_trained_now": res.steps - (res.resumed_from_step or 0),
        # the host each rank said it ran on (its hostname), by rank
        "placement": {str(r): h for r, h in sorted(jobs[-1].placement.items())} if jobs else {},
    }
    write_json(out_dir / "result.json", summary)
    return summary
