"""Airflow's execution API for one ``dagtrain run``, made ready while the run is checked:

    python -P -m dagtrain.cli.apiserver LOG

binds its own socket on 127.0.0.1 at once, on a port the system chooses, and writes
that port as one line to stdout (then closes it: everything else it prints goes to
LOG). The port is this process's from the first moment: no other process can take it
between a choice and a bind, so the tasks' tokens and requests reach this server only.
It then builds the app as ``airflow api-server --apps execution`` does (Airflow's own
``create_app(apps="execution")``) and answers one request in-process, which is when
Cadwyn builds the routes of every API version (seconds of CPU, most of the server's
start). It waits for one line on stdin: ``go PID`` once ``dagtrain run`` has checked
the config and migrated the metadata database (the database is not touched before),
``PID`` being the DAG run's process (``dagrun``); anything else or end of file: exit.
Then it serves with uvicorn on its socket, as Airflow does, until SIGTERM. Until
``go`` it gets SIGTERM if ``dagtrain run`` dies; after it, it serves on until the run's
process has ended as well (at most :data:`RUN_GRACE` seconds more): that process stops
the run when ``dagtrain run`` dies, and the tasks' supervisors hear of it from here.

Started so, the seconds of the server's start run beside the config's checks and the
DAG run's own start instead of after them (``dagtrain.cli.run``).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["main"]

# after dagtrain run has died, how long the run's process may take to end while this
# serves its tasks' supervisors (its own stop ends it within 30 s: dagrun.STOP_DEADLINE)
RUN_GRACE = 35.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sys.stdout.write(f"{sock.getsockname()[1]}\n")
    sys.stdout.flush()
    log = os.open(args[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 1)  # the port was the only line for dagtrain run; the rest is the log's
    os.dup2(log, 2)
    os.close(log)
    os.environ["AIRFLOW_API_APPS"] = "execution"
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"  # as airflow.api_fastapi.main sets it

    import uvicorn
    from airflow.api_fastapi.app import create_app
    from airflow.api_fastapi.auth.tokens import get_signing_args
    from airflow.configuration import conf
    from starlette.testclient import TestClient

    get_signing_args()  # as `airflow api-server` does before it serves
    app = create_app(apps="execution")
    # no lifespan (it opens the database): the routes alone, built by the first request
    TestClient(app, raise_server_exceptions=False).get("/execution/health")
    print("dagtrain: the execution API is built; waiting for the database", flush=True)
    parent = os.getppid()
    words = sys.stdin.readline().split()
    if not words or words[0] != "go":
        return 1
    run_pid = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    timeout = conf.getint("api", "worker_timeout", fallback=120)
    config = uvicorn.Config(
        app,
        timeout_keep_alive=timeout,
        timeout_graceful_shutdown=timeout,
        access_log=False,  # Airflow's HttpAccessLogMiddleware logs each request
        log_level=conf.get("logging", "uvicorn_logging_level", fallback="info").lower(),
        log_config=None,  # Airflow's structlog setup stays
    )
    server = uvicorn.Server(config)
    if run_pid is not None:
        from dagtrain.rank_env import parent_death_signal

        run = ended_check(run_pid)  # taken now, while the pid is surely the run's
        parent_death_signal(0)()  # dagtrain run's death no longer ends this at once
        threading.Thread(
            target=_serve_the_run, args=(server, parent, run), name="outlive", daemon=True
        ).start()
    server.run(sockets=[sock])
    return 0


def _serve_the_run(server, parent: int, run_ended: Callable[[], bool]) -> None:
    """Once dagtrain run (``parent``) has gone and the run's process has ended too, or
    RUN_GRACE seconds after: stop serving, and exit 5 s later if the server has not."""
    try:
        how = watch(lambda: os.getppid() != parent, run_ended, RUN_GRACE)
        print(f"dagtrain: dagtrain run has gone and the run's process {how}", flush=True)
    finally:
        server.should_exit = True
        time.sleep(5.0)
        os._exit(0)


def watch(
    parent_gone: Callable[[], bool],
    run_ended: Callable[[], bool],
    deadline: float,
    tick: float = 0.2,
) -> str:
    """Wait while ``parent_gone()`` is false; then until ``run_ended()``, at most
    ``deadline`` seconds: ``"ended"`` or ``"deadline"``."""
    while not parent_gone():
        time.sleep(tick)
    end = time.monotonic() + deadline
    while not run_ended():
        if time.monotonic() >= end:
            return "deadline"
        time.sleep(tick)
    return "ended"


def ended_check(pid: int) -> Callable[[], bool]:
    """Whether process ``pid``, as it is now, has ended since: a zombie its new parent
    has not reaped yet has; a process that took the number later is not it (psutil
    compares the start time). An error reading it says "not yet" (the caller's deadline
    bounds the wait)."""
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return lambda: True

    def check() -> bool:
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    return check


if __name__ == "__main__":
    from .embedded import end_now

    end_now(main())
