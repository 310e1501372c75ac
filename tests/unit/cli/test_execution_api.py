"""The execution API of ``dagtrain run`` (``dagtrain.cli.apiserver``) holds its port
from before anyone knows it: no other local process can take the port between a choice
and a bind and so receive the tasks' tokens and answer their requests."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import threading

from dagtrain.cli.apiserver import ended_check, watch
from dagtrain.cli.embedded import ExecutionAPI


def test_the_port_is_the_servers_own_from_the_moment_it_is_known(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    log = tmp_path / "api.log"
    api = ExecutionAPI(log)
    try:
        assert api.url == f"http://127.0.0.1:{api.port}/execution"
        for reuse in (False, True):  # a racer that binds first, however it asks
            with socket.socket() as s:
                if reuse:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", api.port))
                except OSError as e:
                    assert e.errno == errno.EADDRINUSE
                else:
                    raise AssertionError(f"port {api.port} could be bound beside the server")
    finally:
        api.stop()
    assert api.proc.poll() is not None  # stopped before its go: nothing left


def test_once_dagtrain_run_has_died_the_server_serves_until_the_runs_process_has_ended():
    """``watch``: the server goes on while dagtrain run lives; once it has died, until
    the DAG run's process has ended (a zombie not reaped yet counts), or the deadline."""
    gone = threading.Event()
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        said: list[str] = []
        args = (gone.is_set, ended_check(run.pid), 30.0, 0.05)
        waiter = threading.Thread(target=lambda: said.append(watch(*args)), daemon=True)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # dagtrain run alive
        gone.set()
        waiter.join(0.5)
        assert waiter.is_alive()  # dagtrain run gone, the run's process alive
        run.kill()  # not waited for: a zombie, which has ended
        waiter.join(10)
        assert said == ["ended"]
    finally:
        run.kill()
        run.wait()
    assert ended_check(run.pid)()  # gone before the check was taken
    assert watch(lambda: True, lambda: False, 0.2, 0.05) == "deadline"
