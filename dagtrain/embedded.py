"""An embedded Airflow for one project: SQLite metadata under ``.dagtrain/airflow``.

``environment()`` gives the variables every Airflow process of the project shares (its
home, the DAGs folder, one JWT secret, the API server's URL, the login of the simple
auth manager); they must be set before ``airflow`` is first imported. ``run_pipeline``
runs a DAG once through ``dag.test()``: a real DAG run in the metadata database (it
stays visible in the web UI of ``dagtrain up``), tasks run in this process one after
another, their output into a log file while a progress table is drawn.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagtrain.config import PipelineConfig

__all__ = ["Home", "StageRow", "dag_file_for", "output_to", "run_pipeline"]

USER = "admin"


@dataclass
class Home:
    """The project-local directory (default ``./.dagtrain``) and what lives in it."""

    root: Path
    dags: Path
    port: int = 8080

    @property
    def airflow(self) -> Path:
        return self.root / "airflow"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def db(self) -> Path:
        return self.airflow / "airflow.db"

    @property
    def passwords(self) -> Path:
        return self.airflow / "passwords.json"

    def secret(self, name: str) -> str:
        path = self.airflow / f".{name}"
        if not path.exists():
            self.airflow.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text().strip()

    def password(self) -> str:
        if not self.passwords.exists():
            self.airflow.mkdir(parents=True, exist_ok=True)
            self.passwords.write_text(json.dumps({USER: secrets.token_urlsafe(12)}))
            self.passwords.chmod(0o600)
        return json.loads(self.passwords.read_text())[USER]

    def environment(self) -> dict[str, str]:
        self.password()  # the file must exist before the api-server reads it
        url = f"http://localhost:{self.port}"
        return {
            "AIRFLOW_HOME": str(self.airflow),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords),
            "AIRFLOW__API_AUTH__JWT_SECRET": self.secret("jwt_secret"),
            "AIRFLOW__API__SECRET_KEY": self.secret("api_secret"),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs / "airflow"),
            # the log servers of the workers and the triggerer: next to the api-server's
            # port, so two projects' Airflows do not collide on the defaults (8793/8794)
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port + 1),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.port + 2),
        }

    def activate(self) -> None:
        """Set this home's environment in this process (before airflow is imported)."""
        if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(self.airflow):
            # airflow reads its settings once, at import: too late to point it elsewhere
            raise RuntimeError(
                "airflow was imported before the dagtrain home was set up; call "
                "Home.activate() first"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        os.environ.update(self.environment())

    def migrate(self) -> None:
        from airflow.utils.db import initdb, upgradedb

        if self.db.exists():
            upgradedb()
        else:
            initdb()


def dag_file_for(config: Path, cfg: PipelineConfig, home: Path) -> Path:
    """The DAG file that builds ``config``'s DAG: ``<stem>.py`` beside it, or one
    generated in ``<home>/dags`` that reads the config where it is (so its relative
    paths keep their meaning)."""
    beside = config.with_suffix(".py")
    if beside.exists():
        return beside
    d = home / "dags"
    d.mkdir(parents=True, exist_ok=True)
    builder = "rounds_dag" if cfg.pipeline == "rounds" else "retraining_dag"
    stub = d / f"{config.stem}.py"
    stub.write_text(
        f'"""Airflow DAG generated by `dagtrain run` for {config}."""\n\n'
        f"from dagtrain.pipelines import {builder}\n\n"
        f"dag = {builder}({str(config)!r})\n"
    )
    return stub


@contextlib.contextmanager
def output_to(log_path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so Airflow's
    structlog and any child process too) to ``log_path`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


@dataclass
class StageRow:
    task_id: str
    map_index: int
    state: str | None
    try_number: int
    seconds: float | None


@dataclass
class Poller:
    """Reads the run's task states from the SQLite file (its own connection, read-only)."""

    db: Path
    dag_id: str
    since: float
    rows: list[StageRow] = field(default_factory=list)
    run_id: str | None = None

    def poll(self) -> list[StageRow]:
        try:
            con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=0.2)
        except sqlite3.Error:
            return self.rows
        try:
            if self.run_id is None:
                row = con.execute(
                    "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                    (self.dag_id,),
                ).fetchone()
                if row is None:
                    return self.rows
                self.run_id = row[0]
            cur = con.execute(
                "SELECT task_id, map_index, state, try_number, "
                "(julianday(COALESCE(end_date, 'now')) - julianday(start_date)) * 86400.0 "
                "FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
                (self.dag_id, self.run_id),
            )
            self.rows = [StageRow(t, m, s, n, sec) for t, m, s, n, sec in cur.fetchall()]
        except sqlite3.Error:
            pass  # the run's writer holds the lock: next time
        finally:
            con.close()
        return self.rows


_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_END = re.compile(r"\[DAG TEST\] end task task_id=(\S+) map_index=(-?\d+)")


def write_task_logs(log_path: Path, offset: int, base: Path, dag_id: str, run_id: str) -> int:
    """Cut this run's part of ``log_path`` (from byte ``offset``) into one file per task
    try, where Airflow's UI looks for task logs (the default ``log_filename_template``).
    ``dag.test()`` runs the tasks in this process and writes no task log files itself.
    Returns the number of files written."""
    tries: dict[tuple[str, int], int] = {}
    current: tuple[str, int] | None = None
    lines: list[str] = []
    written = 0

    def flush() -> None:
        nonlocal written
        if current is None or not lines:
            return
        task, index = current
        tries[current] = tries.get(current, 0) + 1
        d = base / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task}"
        if index >= 0:
            d = d / f"map_index={index}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"attempt={tries[current]}.log").write_text("".join(lines))
        written += 1

    with open(log_path, errors="replace") as f:
        f.seek(offset)
        for line in f:
            if (m := _START.search(line)) is not None:
                flush()
                current, lines = (m.group(1), int(m.group(2))), []
            if current is not None:
                lines.append(line)
            if _END.search(line) is not None:
                flush()
                current, lines = None, []
    flush()
    return written


def run_pipeline(
    dag: Any, conf: dict[str, Any], log_path: Path, db: Path, on_poll=None
) -> tuple[Any, list[StageRow]]:
    """``dag.test(run_conf=conf)`` with stdout/stderr into ``log_path``; returns the run
    and its task rows. ``on_poll(rows)`` is called about twice a second."""
    poller = Poller(db, dag.dag_id, time.time())
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if on_poll:
                on_poll(poller.poll())

    watcher = threading.Thread(target=watch, daemon=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    with output_to(log_path):
        watcher.start()
        try:
            dr = dag.test(run_conf=conf or None)
        finally:
            done.set()
            watcher.join()
    poller.run_id = dr.run_id
    base = os.environ.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER")
    if base:
        write_task_logs(log_path, offset, Path(base), dag.dag_id, dr.run_id)
    rows = poller.poll()
    if on_poll:
        on_poll(rows)
    return dr, rows
