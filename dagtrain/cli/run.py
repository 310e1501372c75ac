"""``dagtrain run CONFIG``: one run of a pipeline through Airflow, on this machine.

The run is Airflow's own: ``dag.test(use_executor=True)`` on the embedded SQLite
database, each task sent to the LocalExecutor, whose supervisor runs it and writes its
log where the web UI reads it (``embedded``). It runs in a process of its own, in a
session of its own (``dagrun``), so that the terminal's Ctrl-C reaches this process
alone; this one shows what the plugin's listener and the ranks report (``progress``) —
Airflow's own output goes to a log file, never into the display or the task logs —
then a summary (``summary.outcome_lines``), read from what the phases returned.

Ctrl-C (or SIGTERM) stops the run the way Airflow stops one (``stop``): the run is
marked failed, each running task's supervisor terminates its task (the operator's
``on_kill``: the ranks and their launcher end), and the command exits 130 once every
process it started has ended — within ``STOP_GRACE`` seconds, after which, or at a
second Ctrl-C, they are killed at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.live import Live

from dagtrain.config import PipelineConfig

if TYPE_CHECKING:
    from dagtrain.records.registry import RegistryEntry

from .common import (
    ConfigArg,
    HomeOpt,
    ModelCheck,
    Sets,
    Unbroken,
    fail,
    home_flag,
    home_of,
    load,
    out,
    start_preflight,
)
from .stop import Interrupts, Strays, fail_again, fail_run, kill_family

__all__ = ["run"]


# after the DAG run has ended, how long dag.test() may take to shut its LocalExecutor down
# before this process stops it itself: Airflow 3.3's LocalExecutor.end() joins its
# workers without a deadline, and one that missed its shutdown message (seen under
# load) would keep the run from ever returning
EXECUTOR_GRACE = 20.0
# after the first Ctrl-C, how long Airflow may take to stop the run's tasks (a
# supervisor's heartbeat, then SIGTERM and on_kill, then SIGKILL five seconds later)
STOP_GRACE = 13.0
INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C
_STOPPING = "stopping the run … (press Ctrl-C again to stop at once)"


class _Stop(Exception):
    """Something to tell the user once the terminal is theirs again, and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Interrupted(Exception):
    """Ctrl-C (or SIGTERM) before the DAG run started."""


def _terminal() -> Console:
    """A console on a duplicate of this process's stdout, made before Airflow's output is
    sent to the log: the display stays on the terminal (or the pipe)."""
    fd = os.dup(sys.stdout.fileno())
    f = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace")
    width = shutil.get_terminal_size().columns if f.isatty() else None
    # a pipe whose reader Ctrl-C ended (| tee) must not stop the run's orderly stop
    return Console(file=Unbroken(f), width=width, soft_wrap=True, highlight=False, markup=False)


class _Session:
    """What the signal handler needs of a run in progress."""

    def __init__(self, term: Console) -> None:
        self.term = term
        self.polling = False  # the main loop reacts to signals itself
        self.announced = False
        self.back: subprocess.Popen | None = None
        self.run: tuple[str, str] | None = None  # (dag_id, run_id) once known
        self.scratch: Path | None = None  # the run's temporary files (TMPDIR)

    def on_signal(self, count: int) -> None:
        if self.polling:
            return
        if count == 1:  # a blocking step (Airflow starting, the DAG parsed): say it now
            self.announce()
        else:
            self.hard_stop()
            self.term.file.flush()
            os._exit(INTERRUPTED)

    def announce(self) -> None:
        if not self.announced:
            self.announced = True
            self.term.print(_STOPPING, style="yellow")

    def hard_stop(self) -> None:
        """Every process this command started, killed; the run marked failed."""
        kill_family(os.getpid())
        if self.scratch is not None:  # what the killed processes could not remove
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self.run is not None:
            with contextlib.suppress(Exception):
                fail_run(*self.run)
        self.term.print("stopped at once: every process of the run was killed", style="yellow")


def run(config: ConfigArg, sets: Sets = None, home: HomeOpt = Path(".dagtrain")) -> None:
    """Run a pipeline through Airflow (embedded, SQLite), showing its progress.

    Ends with a summary and the task logs' paths (`dagtrain logs` prints them). Ctrl-C
    stops the run (its tasks, their ranks) and exits 130; a second Ctrl-C at once."""
    loaded = load(config, sets)  # a bad config or --set: refused before anything starts
    term = _terminal()
    session = _Session(term)
    interrupts = Interrupts(session.on_signal).install()
    # every temporary file of the run (a training task's, mpirun's session folder) goes
    # into one folder of this command's, removed however the run ends: a task killed at
    # once (a second Ctrl-C) cannot remove its own
    session.scratch = Path(tempfile.mkdtemp(prefix="dagtrain-cli-"))
    os.environ["TMPDIR"] = str(session.scratch)
    try:
        _main(config, loaded, home, term, session, interrupts)
    finally:
        interrupts.restore()
        shutil.rmtree(session.scratch, ignore_errors=True)


def _main(config, loaded, home: Path, term: Console, session: _Session, interrupts) -> None:
    cfg, conf, eff = loaded
    check = start_preflight(eff, home)  # the data, the backend's library: refused at once
    fresh = not home.exists()
    from .embedded import dag_file_for, output_to

    dag_file = dag_file_for(config.resolve(), cfg, home.resolve())
    h = home_of(home, dag_file.parent)
    h.activate()  # before anything imports airflow (its port: the execution API's, in _run)
    from dagtrain.plugins.listener import PROGRESS_VARIABLE

    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = h.logs / f"run-{cfg.name}-{stamp}.log"
    events = h.logs / f"run-{cfg.name}-{stamp}.events.jsonl"
    os.environ[PROGRESS_VARIABLE] = str(events)  # the tasks' listener appends there
    t0 = time.monotonic()
    stop: _Stop | None = None
    result: tuple[Any, Any] | None = None
    with output_to(log):
        try:
            result = _run(h, dag_file, conf, eff, term, log, events, session, interrupts, check)
        except _Stop as e:
            stop = e
        except _Interrupted:
            pass
        finally:
            check.stop()
    if result is None and fresh and not h.db.exists():
        # refused, or stopped, before Airflow had a database: no home is left behind
        shutil.rmtree(h.root, ignore_errors=True)
    if result is None and interrupts.count:
        raise _exit_interrupted(term, "before the run started")
    if stop is not None:
        raise fail(str(stop), stop.code)
    assert result is not None
    state, dag_id, run_id, progress = result
    _summary(eff, state, dag_id, run_id, progress, time.monotonic() - t0, log, interrupts)


def _exit_interrupted(term: Console, when: str) -> typer.Exit:
    term.print(f"stopped {when}; nothing it started is left running", style="yellow")
    return typer.Exit(INTERRUPTED)


def _run(
    h,
    dag_file: Path,
    conf: dict,
    eff: PipelineConfig,
    term,
    log: Path,
    events,
    session,
    interrupts,
    check: ModelCheck,
):
    """Airflow's execution API and the DAG run's process start at once and make ready
    (imports, routes, the DAG parsed) while the model check runs; the metadata database
    is migrated once the check has passed, then the API serves and the run starts."""
    from dagtrain.errors import InputError, MissingDependency
    from dagtrain.records.layout import ArtifactLayout

    from .embedded import ExecutionAPI, go, stop_all, the_dag

    def cancelled() -> bool:
        return interrupts.count > 0

    when = datetime.now(UTC)
    try:
        api = ExecutionAPI(log)
    except RuntimeError as e:
        raise _Stop(str(e)) from None
    try:
        h.execution_port = api.port  # the socket it bound: the tasks' supervisors'
        h.ui_url = h.served_url()  # the UI's, as `dagtrain up` last served the home
        h.activate()
        session.back = back = _start(h, dag_file, when, conf, log)
    except BaseException:
        api.stop()
        raise
    started = False
    try:
        from sqlalchemy.exc import SQLAlchemyError

        from .progress import Display
        from .stop import run_id_for

        try:
            dag = the_dag(dag_file)
        except ValueError as e:
            raise _Stop(str(e)) from None
        run_id = run_id_for(when)
        task_ids = [t.task_id for t in dag.topological_sort() if not _mapped(t)]
        progress = Display(
            term,
            f"{dag.dag_id}  {run_id}",
            events,
            ArtifactLayout.of(eff.for_dag(dag.dag_id)).run(run_id).dir,
            task_ids,
        )
        try:
            if not check.verdict(cancelled):
                raise _Interrupted
        except (InputError, MissingDependency) as e:
            raise _Stop(str(e), code=2) from None
        term.print(f"starting Airflow (metadata: {h.db}; its output: {log})")
        term.print(f"artifacts: {eff.artifact_root()}")
        try:
            h.migrate()
        except SQLAlchemyError as e:
            raise _Stop(f"the metadata database {h.db}: {e}") from None
        if cancelled() or not api.serve(back, cancelled=cancelled):
            raise _Interrupted
        term.print(f"running {dag.dag_id} ({dag_file.name}), run {run_id}")
        session.run = (dag.dag_id, run_id)
        go(back)
        started = True
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
        with live:
            _follow(session, interrupts, progress)
            progress.poll()  # the last events, written before the tasks ended
            progress.settle(_task_states(dag.dag_id, run_id))  # the table's last look
    except RuntimeError as e:
        raise _Stop(str(e)) from None
    finally:
        if not started:  # it waits for its go, or imports: nothing of the run exists
            stop_all([back], grace=1.0)
        api.stop()
    return _state(dag.dag_id, run_id), dag.dag_id, run_id, progress


def _mapped(task) -> bool:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    return isinstance(task, MappedOperator)


def _start(h, dag_file: Path, when: datetime, conf: dict, log: Path):
    """The DAG run's own process (``dagrun``): a session of its own (the terminal's
    signals are this process's), SIGTERM when this process dies. It makes ready, then
    waits for its ``go`` on stdin."""
    from dagtrain.rank_env import parent_death_signal

    conf_file = log.with_suffix(".conf.json")
    conf_file.write_text(json.dumps(conf or {}))
    argv = [sys.executable, "-P", "-m", "dagtrain.cli.dagrun"]
    argv += [str(dag_file), when.isoformat(), str(conf_file)]
    with open(log, "ab") as f:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),  # noqa: PLW1509 (a bare prctl)
        )


def _follow(session: _Session, interrupts: Interrupts, progress) -> None:
    """Show the run until its process ends; stop it on Ctrl-C."""
    back = session.back
    dag_id, run_id = session.run
    session.polling = True
    ended: float | None = None
    stopping: float | None = None
    marked: str | None = None  # the run's state once the stop had marked it
    strays = Strays(dag_id, run_id)
    try:
        while back.poll() is None:
            progress.poll()
            now = time.monotonic()
            if interrupts.count >= 2 or (stopping is not None and now - stopping > STOP_GRACE):
                progress.stopping = True
                session.hard_stop()
                break
            if interrupts.count == 1 and stopping is None:
                stopping = now
                progress.stopping = True
                if not session.announced:
                    session.announced = True
                    progress.say(_STOPPING, "yellow")
                    progress.poll()
            if stopping is not None and not marked:
                marked = _fail(dag_id, run_id)
            else:
                strays.poll(marked)  # a task Airflow's loop scheduled over the mark
            if stopping is None and ended is None and _state(dag_id, run_id) in _ENDED:
                ended = now
            elif stopping is None and ended is not None and now - ended > EXECUTOR_GRACE:
                kill_family(back.pid, include_self=True)  # dag.test's executor.end() hangs
                break
            time.sleep(0.5)
        if stopping is not None and not marked:
            _fail(dag_id, run_id)  # its process ended before the run was created
    finally:
        session.polling = False
        with contextlib.suppress(subprocess.TimeoutExpired):
            back.wait(timeout=5)
    if back.poll() is not None:  # dag.test()'s loop has ended
        fail_again(dag_id, run_id, marked)


_ENDED = ("success", "failed")


def _task_states(dag_id: str, run_id: str) -> dict[str, tuple[str, int]]:
    """Each task instance of the run: label -> (state, try number), through the ORM."""
    from airflow.utils.session import create_session

    from dagtrain.plugins import queries

    with create_session() as session:
        return {
            (ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): (
                str(queries.state_text(ti.state)),
                int(ti.try_number or 0),
            )
            for ti in queries.task_instances(session, dag_id, run_id)
        }


def _fail(dag_id: str, run_id: str) -> str | None:
    """``fail_run``: the run's state after (``failed``, or the state it had ended in);
    None: not created yet, or the database was busy (try again)."""
    from sqlalchemy.exc import OperationalError

    try:
        return fail_run(dag_id, run_id)
    except OperationalError:  # SQLite's "database is locked": the next poll tries again
        return None


def _state(dag_id: str, run_id: str) -> str | None:
    """The DAG run's state, read through Airflow's ORM (None: no such run)."""
    from airflow.utils.session import create_session

    from dagtrain.plugins import queries

    with create_session() as session:
        return queries.run_state(session, dag_id, run_id)


def _log_files(dag_id: str, run_id: str) -> None:
    """Each task try's log file, where the web UI reads it; ``dagtrain logs`` prints one."""
    from dagtrain.config import HOME_VARIABLE

    from .logs import log_files

    files = log_files(dag_id, run_id)
    home = Path(os.environ[HOME_VARIABLE])
    where = home_flag(home)
    if files:
        out.print(f"task logs (dagtrain logs {run_id} TASK{where} prints one):")
    for label, n, path in files:
        out.print(f"  {label} try {n}: {path}")


def _mlflow_lines(cfg: PipelineConfig, run_dir: Path, champ: RegistryEntry | None) -> list[str]:
    """Where the run is in MLflow (a pipeline with ``tracking``), from the records its
    phases wrote: the run, the champion's model version, or what is still to log."""
    if cfg.tracking is None:
        return []
    from dagtrain.records.layout import ArtifactLayout
    from dagtrain.tracking import mlflow_links

    links = mlflow_links(run_dir, ArtifactLayout.of(cfg).registry)
    lines = []
    if links["run"] is not None:
        pending = " (some logging missed; the next phase of this run retries it)"
        lines.append(
            f"MLflow run: {links['run']['url']}{pending if links['run']['pending'] else ''}"
        )
    else:
        lines.append(
            f"MLflow: nothing logged: connection {cfg.tracking.connection!r} failed (its "
            "warning is in the task logs)"
        )
    version = links["versions"].get(str(champ.version)) if champ is not None else None
    if version is not None:
        lines.append(f"MLflow champion: {version['name']} v{version['version']} {version['url']}")
    return lines


def _summary(
    cfg: PipelineConfig,
    state: str | None,
    dag_id: str,
    run_id: str,
    progress: Any,
    seconds: float,
    log: Path,
    interrupts: Interrupts,
) -> None:
    from dagtrain.phases.registry import champion, promoted_in
    from dagtrain.records.layout import ArtifactLayout
    from dagtrain.records.registry import read_evaluation
    from dagtrain.records.result import read_summary

    from .summary import outcome_lines

    cfg = cfg.for_dag(dag_id)
    run = ArtifactLayout.of(cfg).run(run_id)
    # a run that ended well before the signal could stop it is not said to be stopped
    cut = bool(interrupts.count) and state != "success"
    stopped = f" (stopped by {interrupts.name})" if cut else ""
    out.print()
    if state is None:
        out.print(f"run {run_id}: never started{stopped}")
    else:
        out.print(f"run {run_id}: {state} in {seconds:.1f} s{stopped}")

    summary = read_summary(run.train.result)  # result.json, as the train phase wrote it
    train = None if summary is None else summary.to_dict()
    evaluation = read_evaluation(run.evaluation)
    promoted = promoted_in(cfg, run_id)
    for line in outcome_lines(
        train,
        None if evaluation is None else evaluation.to_dict(),
        None if promoted is None else promoted.to_dict(),
        metric=cfg.promotion_metric,
    ):
        out.print(line)
    champ = champion(cfg)
    if champ is not None:
        out.print(f"champion model: v{champ.version} {champ.path}")
    traced = next((t.traces for t in run.training_folders() if t.trace_files()), None)
    if traced is not None:
        out.print(f"step traces (open in https://ui.perfetto.dev): {traced}")
    for line in _mlflow_lines(cfg, run.dir, champ):
        out.print(line)
    if run.dir.exists():  # a run stopped or refused before training wrote nothing there
        out.print(f"artifacts: {run.dir}")
    out.print(f"Airflow's output: {log}")
    _log_files(dag_id, run_id)
    if cut:
        ran = [s.label for s in progress.tasks.values() if s.started is not None]
        never = [s.label for s in progress.tasks.values() if s.started is None]
        out.print(
            f"stopped: the run is marked {state or 'failed'}; "
            + (f"{', '.join(ran)} ran" if ran else "no task ran")
            + (f", {', '.join(never)} did not run" if never else "")
        )
    if interrupts.count:
        raise typer.Exit(INTERRUPTED)
    if state != "success":
        failed = [s for s in progress.tasks.values() if s.state == "failed"]
        why = "".join(f"\n  {s.label}: {s.error or 'failed'}" for s in failed)
        raise fail(
            f"the run {state}; failed task(s): {', '.join(s.label for s in failed) or '?'}" + why
        )
