"""A real Airflow for the tests of this folder, and what they share to drive it:
``dagtrain run`` in a pseudo-terminal, ``dagtrain trigger``, the REST API."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).parents[2]
DAGTRAIN = [sys.executable, "-m", "dagtrain"]
PYLIB = Path(__file__).parent / "pylib"  # on the test Airflow's PYTHONPATH


def free_port() -> int:
    # the api-server takes port, the log servers port + 1 and + 2
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000 and all(_free(port + k) for k in (1, 2)):
            return port
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_in_terminal(argv: list[str], columns: int, timeout: float = 600) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal of ``columns`` x 30 as its stdin, stdout and
    stderr; return its exit code and everything it wrote (ANSI codes included)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "30", "TERM": "xterm-256color"}
    p = subprocess.Popen(
        argv, cwd=REPO, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        else:
            p.kill()
            raise AssertionError("dagtrain run did not end: " + b"".join(chunks).decode()[-3000:])
    finally:
        os.close(master)
    return p.wait(30), b"".join(chunks).decode("utf-8", errors="replace")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def password_of(home: Path) -> str:

    return json.loads((home / "airflow" / "passwords.json").read_text())["admin"]


def trigger_here(airflow, *args: str) -> subprocess.CompletedProcess:
    """``dagtrain trigger`` without --url: it finds the Airflow `dagtrain up` runs on --home."""
    argv = [*DAGTRAIN, "trigger", "dagtrain_tiny", "--home", str(airflow["home"]), *args]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DAGTRAIN_AIRFLOW_URL", None)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def trigger(
    airflow, *args: str, password: str | None = None, dag_id: str = "dagtrain_tiny"
) -> subprocess.CompletedProcess:
    argv = [*DAGTRAIN, "trigger", dag_id, "--url", airflow["url"]]
    argv += ["--home", str(airflow["home"]), *args]
    if password is not None:
        argv += ["--password", password]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def post_run(airflow, conf: dict) -> httpx.Response:
    return httpx.post(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns",
        json={"logical_date": None, "conf": conf},
        headers=airflow["headers"],
        timeout=30,
    )


def tiny_run_id(airflow) -> str:
    return re.search(r"run (manual__\S+): success", ANSI.sub("", airflow["screen"])).group(1)
