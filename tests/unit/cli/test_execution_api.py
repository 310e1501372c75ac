"""The execution API of ``dagtrain run`` (``dagtrain.cli.apiserver``) holds its port
from before anyone knows it: no other local process can take the port between a choice
and a bind and so receive the tasks' tokens and answer their requests."""

from __future__ import annotations

import errno
import socket

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
