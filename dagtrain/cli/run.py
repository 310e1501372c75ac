"""``dagtrain run CONFIG``: one run of a pipeline through Airflow, on this machine.

The run is Airflow's own: ``dag.test(use_executor=True)`` on the embedded SQLite
database, each task sent to the LocalExecutor, whose supervisor runs it and writes its
log where the web UI reads it (``embedded``). While it runs, this process shows what
the plugin's listener and the ranks report (``progress``); Airflow's own output goes to
a log file, never into the display or the task logs. Then a summary
(``summary.outcome_lines``), read from what the stages returned.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from dagtrain.config import PipelineConfig

from .common import ConfigArg, HomeOpt, Sets, fail, home_of, load, out, preflight

__all__ = ["run"]


# after the DAG run has ended, how long dag.test() may take to shut its LocalExecutor down
# before this process stops the executor's idle workers itself: Airflow 3.3's
# LocalExecutor.end() joins its workers without a deadline, and one that missed its
# shutdown message (seen under load) would keep the run from ever returning
EXECUTOR_GRACE = 20.0


def _finished(dag_id: str, run_id: str) -> bool:
    """Whether the DAG run has ended, read through Airflow's ORM."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        state = session.scalar(
            select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        )
    return str(getattr(state, "value", state)) in ("success", "failed")


def _stop_idle_workers() -> None:
    """Terminate this process's LocalExecutor worker processes (their title says so)."""
    import psutil

    workers = []
    for child in psutil.Process().children():
        try:
            if "LocalExecutor" in " ".join(child.cmdline()):
                workers.append(child)
                child.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(workers, timeout=5)
    for child in alive:
        child.kill()


class _Stop(Exception):
    """Something to tell the user once the terminal is theirs again."""


def _terminal() -> Console:
    """A console on a duplicate of this process's stdout, made before Airflow's output is
    sent to the log: the display stays on the terminal (or the pipe)."""
    fd = os.dup(sys.stdout.fileno())
    f = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace")
    width = shutil.get_terminal_size().columns if f.isatty() else None
    return Console(file=f, width=width, soft_wrap=True, highlight=False)


def run(config: ConfigArg, sets: Sets = None, home: HomeOpt = Path(".dagtrain")) -> None:
    """Run a pipeline through Airflow (embedded, SQLite), showing its progress.

    Ends with a summary; the task logs are Airflow's own (the web UI of `dagtrain up`)."""
    cfg, conf, eff = load(config, sets)
    preflight(eff)
    from .embedded import dag_file_for, free_port, output_to

    dag_file = dag_file_for(config.resolve(), cfg, home.resolve())
    h = home_of(home, dag_file.parent, port=free_port())
    h.activate()  # before anything imports airflow
    from dagtrain.plugins.listener import PROGRESS_VARIABLE

    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = h.logs / f"run-{cfg.name}-{stamp}.log"
    events = h.logs / f"run-{cfg.name}-{stamp}.events.jsonl"
    os.environ[PROGRESS_VARIABLE] = str(events)  # the tasks' listener appends there
    term = _terminal()
    term.print(f"starting Airflow (metadata: {h.db}; its output: {log})")
    t0 = time.monotonic()
    stop: _Stop | None = None
    result: tuple[Any, Any] | None = None
    with output_to(log):
        try:
            result = _run(h, dag_file, conf, eff, term, log, events)
        except _Stop as e:
            stop = e
    if stop is not None:
        raise fail(str(stop))
    assert result is not None
    dr, progress = result
    _summary(eff, dr, progress, time.monotonic() - t0, log)


def _run(h, dag_file: Path, conf: dict, eff: PipelineConfig, term: Console, log: Path, events):
    from airflow.models.dagrun import DagRun
    from airflow.sdk import timezone
    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from airflow.utils.types import DagRunType

    from dagtrain.stages.files import run_dir

    from .embedded import execution_api, run_pipeline
    from .progress import Progress

    h.migrate()
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(dag_file))
    if bag.import_errors:
        raise _Stop(f"{dag_file} does not import:\n" + "\n".join(bag.import_errors.values()))
    if not bag.dags:
        raise _Stop(f"{dag_file} defines no DAG")
    dag = next(iter(bag.dags.values()))
    when = timezone.utcnow()
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=when, run_after=when)
    stages = [t.task_id for t in dag.topological_sort() if not isinstance(t, MappedOperator)]
    progress = Progress(
        term, f"{dag.dag_id}  {run_id}", events, run_dir(eff.artifact_root(), run_id), stages
    )
    try:
        with execution_api(h, log):
            term.print(f"running {dag.dag_id} ({dag_file.name}), run {run_id}")
            done = threading.Event()

            def follow() -> None:
                ended: float | None = None
                while not done.wait(0.5):
                    progress.poll()
                    if ended is None and _finished(dag.dag_id, run_id):
                        ended = time.monotonic()
                    elif ended is not None and time.monotonic() - ended > EXECUTOR_GRACE:
                        _stop_idle_workers()  # dag.test's executor.end() waits for them
                        ended = float("inf")

            live = (  # sys.stdout/err stay Airflow's (the log): no redirect into the display
                Live(
                    get_renderable=progress.table,
                    console=term,
                    refresh_per_second=2,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                if term.is_terminal
                else contextlib.nullcontext()
            )
            watcher = threading.Thread(target=follow, name="progress", daemon=True)
            with live:
                watcher.start()
                try:
                    dr = run_pipeline(dag, conf, when)
                finally:
                    done.set()
                    watcher.join(timeout=5)
                    progress.poll()  # the last events, written before the tasks ended
    except RuntimeError as e:
        raise _Stop(str(e)) from None
    return dr, progress


def _summary(cfg: PipelineConfig, dr, progress, seconds: float, log: Path) -> None:
    from dagtrain.stages.files import read_json, run_dir
    from dagtrain.stages.registry import champion, promoted_in

    from .summary import outcome_lines

    state = str(getattr(dr.state, "value", dr.state))
    run = run_dir(cfg.artifact_root(), dr.run_id)
    out.print()
    out.print(f"run {dr.run_id}: {state} in {seconds:.1f} s", highlight=False)

    def maybe(path: Path) -> dict | None:
        return read_json(path) if path.exists() else None

    for line in outcome_lines(
        maybe(run / "train" / "result.json"),
        maybe(run / "eval.json"),
        promoted_in(cfg, dr.run_id),
    ):
        out.print(line, highlight=False)
    champ = champion(cfg)
    if champ:
        out.print(f"champion model: v{champ['version']} {champ['path']}", highlight=False)
    traces = sorted(run.rglob("traces/*.json"))
    if traces:
        out.print(
            f"step traces (open in https://ui.perfetto.dev): {traces[0].parent}", highlight=False
        )
    out.print(f"artifacts: {run}", highlight=False)
    out.print(
        f"Airflow's output: {log}; the task logs: `dagtrain up`, then the run in the web UI",
        highlight=False,
    )
    if state != "success":
        failed = [s for s in progress.stages.values() if s.state == "failed"]
        why = "".join(f"\n  {s.label}: {s.error or 'failed'}" for s in failed)
        raise fail(
            f"the run {state}; failed stage(s): {', '.join(s.label for s in failed) or '?'}" + why
        )
