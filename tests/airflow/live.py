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


class Terminal:
    """A command in a pseudo-terminal of ``columns`` x 24 that is its controlling
    terminal, the command the terminal's foreground process group: ``interrupt()``
    types Ctrl-C, which the terminal turns into SIGINT for that group, as in a shell."""

    def __init__(self, argv: list[str], columns: int = 80, env: dict | None = None) -> None:
        import threading

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        env = {**os.environ, **(env or {}), "COLUMNS": str(columns), "LINES": "24"}
        env["TERM"] = "xterm-256color"

        def controlling_terminal() -> None:  # the child is a new session's leader
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=controlling_terminal,  # noqa: PLW1509 (one ioctl, before threads)
        )
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.chunks.append(data)

    @property
    def text(self) -> str:
        return ANSI.sub("", b"".join(self.chunks).decode("utf-8", errors="replace"))

    def wait_for(self, needle: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {needle!r}:\n{self.text[-3000:]}")
            time.sleep(0.1)

    def interrupt(self) -> None:
        os.write(self.master, b"\x03")

    def pause(self) -> None:
        """Ctrl-S: the terminal stops taking output, and the command's next write blocks
        until Ctrl-Q (or for ever)."""
        os.write(self.master, b"\x13")
        time.sleep(1)  # a spinner writes several times a second

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not end in {timeout} s:\n{self.text[-3000:]}") from None
        finally:
            self.reader.join(timeout=5)
            os.close(self.master)


def processes_of_home(home: Path) -> list[psutil.Process]:
    """Every live process started for a dagtrain home: they all have it in their
    environment (DAGTRAIN_HOME), ranks and mpirun included, whatever their session."""
    found = []
    for p in psutil.process_iter():
        try:
            mine = p.pid != os.getpid() and p.environ().get("DAGTRAIN_HOME") == str(home)
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def run_states(home: Path, dag_id: str) -> list[str]:
    """The states of the DAG's runs, as `airflow dags list-runs` prints them (none: the
    DAG is not in the database)."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow' / 'airflow.db'}",
    }
    r = subprocess.run(
        [sys.executable, "-P", "-m", "airflow", "dags", "list-runs", dag_id, "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if r.returncode != 0 and "does not exist" in r.stdout + r.stderr:
        return []  # the DAG never reached the database: no run of it either
    assert r.returncode == 0, r.stdout + r.stderr
    table = next(line for line in r.stdout.splitlines() if line.startswith("["))  # not a warning
    return [row["state"] for row in json.loads(table)]
