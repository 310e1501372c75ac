"""A real MLflow tracking server for the tests, in a virtual environment of its own.

The server (``mlflow``, with its Flask/SQLAlchemy/alembic pins) does not share Airflow's
environment: ``server_venv()`` builds one from ``mlflow-server-requirements.txt`` (uv or
pip from the package index, ``tests/venvs.py``) under ``~/.cache/dagtrain/``, named after
the file's digest, so it is built once per machine and reused; where it cannot be built
(no index), the caller skips, saying why. ``MlflowServer`` runs ``mlflow server`` on a
SQLite backend store and a local artifact root, waits for it with a deadline, and stops it
(and all its workers: its own process group) in ``stop()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from tests import venvs

REQUIREMENTS = Path(__file__).with_name("mlflow-server-requirements.txt")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dagtrain"


class CannotBuild(RuntimeError):
    """The server's environment could not be built here (the message says why)."""


def server_venv(timeout: float = 900) -> Path:
    """The MLflow server's virtual environment, built on first use (a file lock keeps
    two test processes from building it at once). CannotBuild when the install fails."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = CACHE / f"mlflow-server-{digest}"
    done = venv / ".complete"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"mlflow-server-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a build that did not finish
        try:
            pip = venvs.build(venv, ["-r", str(REQUIREMENTS)], timeout)
        except (subprocess.SubprocessError, OSError) as e:
            raise CannotBuild(f"could not build the MLflow server's venv in {venv}: {e}") from e
        if pip.returncode != 0:
            lines = [x for x in pip.stderr.splitlines() if "WARNING: Location" not in x]
            raise CannotBuild(
                f"could not install the MLflow server ({REQUIREMENTS.name}) in {venv}: "
                + " | ".join(lines[-3:])
            )
        done.touch()
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on ``port`` with its store and artifacts under ``folder``."""

    def __init__(self, venv: Path, folder: Path, port: int | None = None) -> None:
        self.venv, self.folder = venv, folder
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = folder / "server.log"

    def start(self, timeout: float = 120) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [str(self.venv / "bin" / "python"), "-m", "mlflow", "server"]
        argv += ["--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}"]
        argv += ["--artifacts-destination", str(self.folder / "artifacts")]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        # lean: no job runner, whose ~10 huey consumer processes (GenAI scoring jobs,
        # unused here) competed with the tests' ranks for the two cores
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        for k in ("PYTHONPATH", "VIRTUAL_ENV"):
            env.pop(k, None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.folder,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not up in {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self, kill: bool = False) -> None:
        """Stop the server and its workers (its process group: uvicorn's)
        and wait for it; ``kill``: at once, as a server that dies (SIGKILL)."""
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL if kill else signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        # its workers are in its group: none outlives it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
