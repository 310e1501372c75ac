"""Stopping a run that ``dagtrain run`` started: Ctrl-C (SIGINT), SIGTERM, or SIGHUP
(its terminal closed).

The first signal asks Airflow to stop the run: ``fail_run`` marks the DAG run failed
through the service behind Airflow's REST API (``PATCH .../dagRuns/{id}`` with state
``failed``: the running task instances become failed, those not yet started skipped,
and the listeners are told), as the web UI's "Mark as failed" does. Each running task's
supervisor then learns from its next heartbeat that its task should not run any more
and terminates it (SIGTERM: the task runner calls the operator's ``on_kill``, which for
training kills the ranks and their launcher). The second signal stops at once:
``kill_family`` SIGKILLs every process the command started, and the run is marked
failed if it is not already. While the run's process ends, a task that Airflow's loop
queued over the mark is stopped by the same mark again (``fail_strays``); once the
process has ended, a run the first signal marked failed is marked failed again if the
loop finished it as a success after the mark (``fail_again``).

Signals are counted, never raised (``Interrupts``), so no ``KeyboardInterrupt``
traceback reaches the terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

__all__ = [
    "STRAY_MARKS",
    "Interrupts",
    "Strays",
    "fail_again",
    "fail_run",
    "fail_strays",
    "kill_family",
    "run_id_for",
]

# at most this many marks again for stray tasks (``Strays``) while a run's process ends
# (a mark whose commit fails is not counted, though its listeners may have fired)
STRAY_MARKS = 3


# signals closer together than this are one press of Ctrl-C: a forwarded copy of the
# first comes within milliseconds on an idle machine, but a wrapper that forwards it
# (`timeout`) may wait for a CPU that training holds; a person's second press follows
# the "stopping the run" line they read
SAME_PRESS = 1.0


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP counted: ``count``, the time of the first (``first``), and a
    callback run in the signal handler (``on_signal(count)``) for what must happen at
    once. Signals within ``SAME_PRESS`` seconds of the one before count once.
    ``install()`` replaces the handlers, ``restore()`` puts the old ones back."""

    def __init__(self, on_signal: Callable[[int], None] | None = None) -> None:
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self.name = ""
        self.on_signal = on_signal
        self._previous: dict[int, Any] = {}

    def install(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last < SAME_PRESS:
            # one Ctrl-C delivered twice: the terminal's to the whole foreground group,
            # and again by a wrapper that forwards it (`timeout 600 dagtrain run ...`)
            return
        self.last = now
        self.count += 1
        if self.first is None:
            self.first = now
            self.name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal(self.count)
        self.last = time.monotonic()  # a copy that waited for the callback is the same press


def run_id_for(when: datetime) -> str:
    """The run id ``dag.test()`` gives a manual run of logical date and run_after
    ``when`` (``dagtrain run`` passes both)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    return DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=when, run_after=when)


def fail_run(dag_id: str, run_id: str, *, overwritten: bool = False) -> str | None:
    """Mark the DAG run failed if it has not ended, as Airflow's REST API does for
    ``PATCH`` with state ``failed``; return its state after (None: no such run yet).

    ``overwritten``: also if it ended ``success``, for a run this process had marked
    failed. ``dag.test()``'s loop can finish such a run as a success: its last
    ``update_state`` read the run as running before the mark and the task instances
    after it, when the mark had left no leaf failed (the running tasks failed, the rest
    skipped, and Airflow judges a run by its leaves), and wrote ``success`` over
    ``failed``. The loop has ended by then: the second mark stays."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import DagRunMutableStates
    from airflow.api_fastapi.core_api.services.public.dag_run import patch_dag_run_state
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    from dagtrain.plugins import queries

    with create_session() as session:
        dr = queries.dag_run(session, dag_id, run_id)
        if dr is None:
            return None
        ended = (DagRunState.SUCCESS,) if overwritten else ()
        if dr.state in (DagRunState.RUNNING, DagRunState.QUEUED, *ended):
            dag = DBDagBag().get_dag_for_run(dr, session=session)
            patch_dag_run_state(
                dag=dag, dag_run=dr, state=DagRunMutableStates.FAILED, session=session
            )
        return queries.state_text(dr.state)


def fail_again(dag_id: str, run_id: str, marked: str | None, *, tries: int = 3) -> None:
    """Once ``dag.test()``'s loop has ended: a run this process's stop had marked failed
    (``marked``: what that ``fail_run`` returned) marked failed again, since the loop may
    have written success over the mark (``fail_run``). Anything else is left alone: a
    run the stop found ended (``marked`` ``success``) ended before the stop. A busy
    database is tried up to ``tries`` times, half a second apart, then said on stderr;
    nothing is raised (the caller is ending its process)."""
    if marked != "failed":
        return
    for attempt in range(tries):
        try:
            fail_run(dag_id, run_id, overwritten=True)
            return
        except Exception as e:  # SQLite's "database is locked", or the database gone
            if attempt == tries - 1:
                print(f"dagtrain: marking the run failed again: {e}", file=sys.stderr, flush=True)
            else:
                time.sleep(0.5)


def fail_strays(dag_id: str, run_id: str) -> list[str]:
    """Stop the tasks of a failed run that are still scheduled, queued or running (not
    a teardown, which Airflow's mark leaves to finish) by marking the run failed again,
    as ``fail_run`` does: a scheduled or queued task is skipped before it starts, a
    running one failed, which its supervisor then terminates. Returns their ids (none:
    nothing was done). After the stop's mark these are tasks that ``dag.test()``'s loop
    had read as ready just before it, then scheduled over the mark's ``skipped``. The
    mark fires the run's ``on_dag_run_failed`` listeners again, as a second ``PATCH``
    of Airflow's REST API does."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import DagRunMutableStates
    from airflow.api_fastapi.core_api.services.public.dag_run import patch_dag_run_state
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    from dagtrain.plugins import queries

    alive = (TaskInstanceState.SCHEDULED, TaskInstanceState.QUEUED, TaskInstanceState.RUNNING)
    with create_session() as session:
        dr = queries.dag_run(session, dag_id, run_id)
        if dr is None or dr.state != DagRunState.FAILED:
            return []
        ids = {
            ti.task_id
            for ti in queries.task_instances(session, dag_id, run_id)
            if ti.state in alive
        }
        dag = DBDagBag().get_dag_for_run(dr, session=session) if ids else None
        if dag is None:
            return []
        strays = sorted(i for i in ids if i in dag.task_dict and not dag.task_dict[i].is_teardown)
        if strays:
            patch_dag_run_state(
                dag=dag, dag_run=dr, state=DagRunMutableStates.FAILED, session=session
            )
        return strays


class Strays:
    """While a stopped run's process ends: ``poll()`` on each pass of the caller's wait
    stops, with ``fail_strays``, a task Airflow's loop scheduled over the stop's mark,
    once the stop has marked the run failed (``marked``: what ``fail_run`` returned).
    At most :data:`STRAY_MARKS` marks succeed; an error (the database busy) is passed to
    ``say`` if given, and the next poll tries again."""

    def __init__(self, dag_id: str, run_id: str, say: Callable[[str], None] | None = None):
        self.dag_id, self.run_id, self.say = dag_id, run_id, say
        self.marks = 0

    def poll(self, marked: str | None) -> None:
        if marked != "failed" or self.marks >= STRAY_MARKS:
            return
        try:
            self.marks += bool(fail_strays(self.dag_id, self.run_id))
        except Exception as e:  # SQLite's "database is locked", or the database gone
            if self.say is not None:
                self.say(f"dagtrain: stopping the run's tasks: {e}")


def kill_family(pid: int, include_self: bool = False) -> None:
    """SIGKILL every descendant of process ``pid`` (and it, with ``include_self``),
    found before any is killed (an orphan is adopted by init and no longer found), in
    whatever session or process group it runs (mpirun, the ranks, an api-server)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    if include_self:
        family.append(root)
    for _ in range(3):  # what was being started while we looked
        for proc in family:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.kill()
        psutil.wait_procs(family, timeout=3)
        with contextlib.suppress(psutil.NoSuchProcess):
            late = root.children(recursive=True)
            if not late:
                break
            family = late
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap this process's own children
            pass
