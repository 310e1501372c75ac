"""The process in which ``dagtrain run`` runs the DAG run (Airflow's own
``dag.test(use_executor=True)``), apart from the terminal:

    python -P -m dagtrain.cli.dagrun DAG_FILE DAG_ID LOGICAL_DATE CONF.json

``dagtrain run`` starts it in a session of its own, with the embedded home's
environment, so that a Ctrl-C in the terminal reaches ``dagtrain run`` alone: Airflow's
LocalExecutor workers, the task supervisors and the tasks never see the terminal's
SIGINT, and the run is stopped the way Airflow stops a run (``stop.fail_run``: marked
failed, after which each task's supervisor terminates its task, calling the operator's
``on_kill``). This process then leaves ``dag.test()`` as it would after any failed run,
ending the LocalExecutor's workers.

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
    if len(args) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    dag_file, dag_id, when, conf_file = args
    # the current folder, first, as `python -m` puts it for the ranks and for the checks
    # of `validate`: the tasks, forked from here, import from where the ranks do
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's is dagtrain run's
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda s, f: _stop_from_here(dag_id, when, stopping))

    from airflow.dag_processing.dagbag import DagBag

    from .embedded import run_pipeline

    bag = DagBag(dag_file)
    dag = bag.dags.get(dag_id)
    if dag is None:
        print(f"{dag_file}: no DAG {dag_id!r} ({bag.import_errors})", file=sys.stderr)
        return 1
    conf = json.loads(Path(conf_file).read_text())
    run_pipeline(dag, conf, datetime.fromisoformat(when))
    return 0


def _stop_from_here(dag_id: str, when: str, stopping: threading.Event) -> None:
    if stopping.is_set():
        return
    stopping.set()
    threading.Thread(target=_stop, args=(dag_id, when), name="stop", daemon=True).start()


def _stop(dag_id: str, when: str) -> None:
    from .stop import fail_run, kill_family, run_id_for

    deadline = time.monotonic() + STOP_DEADLINE
    run_id = run_id_for(datetime.fromisoformat(when))
    while time.monotonic() < deadline - 5:  # the run may not exist yet
        try:
            if fail_run(dag_id, run_id) is not None:
                break
        except Exception as e:  # the database busy: try again
            print(f"dagtrain: marking the run failed: {e}", file=sys.stderr, flush=True)
        time.sleep(1)
    while time.monotonic() < deadline:  # dag.test() ends, the process with it
        time.sleep(0.5)
    kill_family(os.getpid())  # it did not: nothing it started outlives it
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
