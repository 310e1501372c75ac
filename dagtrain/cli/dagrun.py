"""The process in which ``dagtrain run`` runs the DAG run (Airflow's own
``dag.test(use_executor=True)``), apart from the terminal:

    python -P -m dagtrain.cli.dagrun DAG_FILE LOGICAL_DATE CONF.json

``dagtrain run`` starts it while it checks the config: it imports Airflow and parses
the DAG file (its one DAG), then waits for one line on stdin, ``go`` once the database
is migrated and the execution API answers (anything else or end of file: exit 1; until
then nothing of the run exists and SIGTERM simply ends it). It runs in a session of its
own, with the embedded home's environment, so that a Ctrl-C in the terminal reaches
``dagtrain run`` alone: Airflow's LocalExecutor workers, the task supervisors and the
tasks never see the terminal's SIGINT, and the run is stopped the way Airflow stops a
run (``stop.fail_run``: marked failed, after which each task's supervisor terminates
its task, calling the operator's ``on_kill``). This process then leaves ``dag.test()``
as it would after any failed run, ending the LocalExecutor's workers.

SIGTERM (which it gets when ``dagtrain run`` dies, however it dies: a parent-death
signal) stops the run the same way from here, and the process ends within
``STOP_DEADLINE`` seconds whatever Airflow does, taking every process it started.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

__all__ = ["STOP_DEADLINE", "main"]

STOP_DEADLINE = 30.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    dag_file, when, conf_file = args
    # the current folder, first, as `python -m` puts it for the ranks and for the checks
    # of `validate`: the tasks, forked from here, import from where the ranks do
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's is dagtrain run's

    from .embedded import run_pipeline, the_dag

    try:
        dag = the_dag(dag_file)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    conf = json.loads(Path(conf_file).read_text())
    _preload()
    if sys.stdin.readline().strip() != "go":
        return 1
    stopping = _Stopping()
    signal.signal(signal.SIGTERM, lambda s, f: _stop_from_here(dag.dag_id, when, stopping))
    run_pipeline(dag, conf, datetime.fromisoformat(when))
    _marked_again(dag.dag_id, when, stopping)
    return 0


class _Stopping(threading.Event):
    """Set once SIGTERM has come; ``marked``: the run's state once the stop marked it."""

    marked: str | None = None


def _preload() -> None:
    """torch imported here, while the run is checked: each task's process is forked from
    this one (the LocalExecutor's workers, then a supervisor for each task), so the
    phases that load a model (evaluate, promote, the rounds' averaging) find it imported
    instead of spending seconds on it each. Importing starts no threads; each task's
    own are made in its process. Without torch (no ``train`` extra) nothing is."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


def _stop_from_here(dag_id: str, when: str, stopping: _Stopping) -> None:
    if stopping.is_set():
        return
    stopping.set()
    args = (dag_id, when, stopping)
    threading.Thread(target=_stop, args=args, name="stop", daemon=True).start()


def _stop(dag_id: str, when: str, stopping: _Stopping) -> None:
    try:
        _stop_run(dag_id, when, stopping)
    except Exception as e:  # said, and the process ends all the same
        print(f"dagtrain: stopping the run: {e}", file=sys.stderr, flush=True)
    finally:
        os._exit(1)  # dag.test() did not end the process in time: this does


def _stop_run(dag_id: str, when: str, stopping: _Stopping) -> None:
    from .stop import Strays, fail_run, kill_family, run_id_for

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    deadline = time.monotonic() + STOP_DEADLINE
    run_id = run_id_for(datetime.fromisoformat(when))
    while time.monotonic() < deadline - 5:  # the run may not exist yet
        try:
            stopping.marked = fail_run(dag_id, run_id)
            if stopping.marked is not None:
                break
        except Exception as e:  # the database busy: try again
            say(f"dagtrain: marking the run failed: {e}")
        time.sleep(1)
    strays = Strays(dag_id, run_id, say)
    while time.monotonic() < deadline:  # dag.test() ends, the process with it
        strays.poll(stopping.marked)  # a task dag.test()'s loop scheduled over the mark
        time.sleep(0.5)
    kill_family(os.getpid())  # it did not: nothing it started outlives it
    _marked_again(dag_id, when, stopping)


def _marked_again(dag_id: str, when: str, stopping: _Stopping) -> None:
    """``stop.fail_again``, for the run of ``when`` once dag.test()'s loop has ended."""
    if stopping.marked == "failed":
        from .stop import fail_again, run_id_for

        fail_again(dag_id, run_id_for(datetime.fromisoformat(when)), stopping.marked)


if __name__ == "__main__":
    from .embedded import end_now

    end_now(main())  # 1.5 s sooner than the interpreter's teardown: dagtrain run waits for it
