"""An embedded Airflow for one project: SQLite metadata under ``.dagtrain/airflow``.

``Home.environment()`` gives the variables every Airflow process of the project shares
(its home, the DAGs folder, one JWT secret, the API server's URL, the login of the
simple auth manager); they must be set before ``airflow`` is first imported.

``run_pipeline`` runs a DAG once the way Airflow's own ``dag.test(use_executor=True)``
does: a real DAG run in the metadata database (visible in the web UI of ``dagtrain
up``), each task sent to the LocalExecutor, whose supervisor runs it and writes its log
where the UI reads it, as for a scheduler-run task. The supervisor reports to Airflow's
execution API: ``ExecutionAPI`` serves it (Airflow's app, as ``airflow api-server --apps
execution`` serves it) for the duration of the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dagtrain.config import HOME_VARIABLE, PipelineConfig

__all__ = [
    "AIRFLOW",
    "ExecutionAPI",
    "Home",
    "dag_file_for",
    "end_now",
    "go",
    "output_to",
    "run_pipeline",
    "stop_all",
    "the_dag",
]

USER = "admin"
_ANY_OR_LOOPBACK = ("127.0.0.1", "localhost", "0.0.0.0", "::", "::1")
# -P: the current directory stays off sys.path, so a checkout's own metadata
# (airflow_provider_dagtrain.egg-info beside pyproject.toml) is not found as a second
# copy of the provider, whose plugin Airflow would then report as registered twice
AIRFLOW = [sys.executable, "-P", "-m", "airflow"]


@dataclass
class Home:
    """The project-local directory (default ``./.dagtrain``) and what lives in it."""

    root: Path
    dags: Path
    port: int = 8080
    host: str = "127.0.0.1"
    # `dagtrain run`: the port of its own execution API (the tasks reach it there); the
    # web UI's address, which links and MLflow's tags name, stays the home's (``url``)
    execution_port: int | None = None
    ui_url: str | None = None  # the web UI's address when not this home's own (``url``)

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

    @property
    def ui_file(self) -> Path:
        """The web UI's address as ``dagtrain up`` last served this home: what a run
        of ``dagtrain run`` names in links that outlive it (MLflow's tags)."""
        return self.airflow / "ui.json"

    def served_url(self) -> str | None:
        try:
            url = json.loads(self.ui_file.read_text())["url"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None

    @property
    def up_file(self) -> Path:
        """Written by ``dagtrain up`` while it runs: its URL, for ``dagtrain trigger``."""
        return self.airflow / "up.json"

    @property
    def url(self) -> str:
        """The web UI's address, as a person types it."""
        host = "localhost" if self.host in _ANY_OR_LOOPBACK else self.host
        return f"http://{host}:{self.port}"

    @property
    def own_port(self) -> int:
        """The port this process's Airflow serves on: the execution API's of a run."""
        return self.execution_port or self.port

    @property
    def execution_url(self) -> str:
        """Where processes on this machine (the workers) reach the execution API."""
        host = "127.0.0.1" if self.host in _ANY_OR_LOOPBACK else self.host
        return f"http://{host}:{self.own_port}"

    def secret(self, name: str) -> str:
        path = self.airflow / f".{name}"
        if not path.exists():
            self.make()
            _private(path, secrets.token_urlsafe(32))
        return path.read_text().strip()

    def password(self) -> str:
        if not self.passwords.exists():
            self.make()
            _private(self.passwords, json.dumps({USER: secrets.token_urlsafe(12)}))
        return json.loads(self.passwords.read_text())[USER]

    def make(self) -> None:
        """The home's folders, only their owner's (the logs hold runs' confs, the
        database their XComs), each made with that mode, parents first."""
        for d in (self.root, self.airflow, self.logs):  # (a missing parent of root: as mkdir -p)
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    def environment(self) -> dict[str, str]:
        self.password()  # the file must exist before the api-server reads it
        url = self.url
        return {
            # every process of the home knows it: a pipeline without artifacts.root keeps
            # its artifacts in <home>/artifacts (dagtrain.config.ArtifactsConfig)
            HOME_VARIABLE: str(self.root),
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
            "AIRFLOW__API__BASE_URL": self.ui_url or url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.execution_url}/execution/",
            # the LocalExecutor starts this many worker processes: one per core, not 32
            "AIRFLOW__CORE__PARALLELISM": str(max(2, os.cpu_count() or 2)),
            # a task's supervisor heartbeats this often (default 5 s): a run marked failed
            # (Ctrl-C on `dagtrain run`, the UI's "Mark as failed") stops its tasks sooner
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs / "airflow"),
            # the log server of the workers and the triggerer (dagtrain.cli.logserver,
            # one for both): next to the api-server's port, so two projects' Airflows do
            # not collide on the defaults (8793/8794)
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.own_port + 1),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.own_port + 1),
            # a task's host, where the api-server reads its running log: the
            # loopback the log server listens on, not a name that may resolve to a
            # network address
            **(
                {"AIRFLOW__CORE__HOSTNAME_CALLABLE": "dagtrain.cli.logserver.loopback"}
                if self.host in _ANY_OR_LOOPBACK and self.host not in ("0.0.0.0", "::")
                else {}
            ),
        }

    def activate(self) -> None:
        """Set this home's environment in this process (before airflow is imported)."""
        if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(self.airflow):
            # airflow reads its settings once, at import: too late to point it elsewhere
            raise RuntimeError(
                "airflow was imported before the dagtrain home was set up; call "
                "Home.activate() first"
            )
        self.make()
        os.environ.update(self.environment())

    def migrate(self) -> None:
        from airflow.utils.db import initdb, upgradedb

        if self.db.exists():
            upgradedb()
        else:
            initdb()


def _private(path: Path, text: str) -> None:
    """``text`` in a new file only its owner may read, from its first byte (not written,
    then chmodded); another process that made it first wins (its text stays)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)


def dag_file_for(config: Path, cfg: PipelineConfig, home: Path) -> Path:
    """The DAG file that builds ``config``'s DAG: ``<stem>.py`` beside it, or one
    generated in ``<home>/dags`` that reads the config where it is (so its relative
    paths keep their meaning), named after the config's stem and its path
    (``p_1a2b3c4d.py``): configs of one file name in two folders get a file each."""
    beside = config.with_suffix(".py")
    if beside.exists():
        return beside
    d = home / "dags"
    d.mkdir(parents=True, exist_ok=True)
    builder = "rounds_dag" if cfg.pipeline == "rounds" else "retraining_dag"
    where = hashlib.sha256(str(config.resolve()).encode()).hexdigest()[:8]
    stub = d / f"{config.stem}_{where}.py"
    old = d / f"{config.stem}.py"  # what an earlier dagtrain named it: a second DAG
    if old.exists() and f"generated by `dagtrain run` for {config}." in old.read_text():
        old.unlink()
    stub.write_text(
        f'"""Airflow DAG generated by `dagtrain run` for {config}."""\n\n'
        f"from dagtrain.pipelines import {builder}\n\n"
        f"dag = {builder}({str(config)!r})\n"
    )
    return stub


@contextlib.contextmanager
def output_to(log_path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so Airflow's
    own output and that of the processes it starts) to ``log_path`` for the duration.
    What the user sees is written to a duplicate of the terminal's descriptor made
    before (see ``dagtrain.cli.progress``), never to these."""
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


STOP_GRACE = 15.0  # seconds stop_all gives a process to end on SIGTERM


def stop_all(procs: list[subprocess.Popen], grace: float = STOP_GRACE) -> None:
    """SIGTERM each process and everything it started, SIGKILL what is left after
    ``grace`` seconds: nothing outlives it, even a child that left the process group
    (Airflow's log server does)."""
    import psutil

    family: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(p.pid)
            family += [root, *root.children(recursive=True)]
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=1)  # reap


class ExecutionAPI:
    """Airflow's execution API (what a task's supervisor talks to) on 127.0.0.1
    (``dagtrain.cli.apiserver``): started at once, it binds its own socket and says its
    port (``port``), builds its routes while the run is checked, and serves once
    ``serve()`` says the database is ready. Until then it gets SIGTERM if this process
    dies; after it, it serves until the run's process has ended as well (at most
    ``apiserver.RUN_GRACE`` seconds after this one's death), then exits. ``stop()``
    ends it."""

    def __init__(self, log: Path, timeout: float = 30.0) -> None:
        import selectors

        from dagtrain.rank_env import parent_death_signal

        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "dagtrain.cli.apiserver", str(log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # until it has said its port; then its log
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),  # noqa: PLW1509 (a bare prctl)
        )
        with selectors.DefaultSelector() as sel:  # a deadline on its one line
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            line = self.proc.stdout.readline() if sel.select(timeout) else b""
        self.proc.stdout.close()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"Airflow's execution API did not start; see {log}")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}/execution"

    def serve(
        self,
        run: subprocess.Popen,
        timeout: float = 120.0,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Tells it the database is ready, and the DAG run's process (``run``, which it
        serves until that has ended, should this process die), and waits for its health
        check: True once it answers, False when ``cancelled()`` first; RuntimeError
        naming the log if it exits or does not answer within ``timeout`` seconds."""
        import httpx

        go(self.proc, str(run.pid))
        deadline = time.monotonic() + timeout
        # the socket is the child's own since before the port was known: what answers is it
        while not cancelled():
            if self.proc.poll() is not None:
                raise RuntimeError(f"Airflow's execution API exited at start; see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Airflow's execution API did not answer within {timeout:g} s; see {self.log}"
                )
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        stop_all([self.proc])


def go(proc: subprocess.Popen, *words: str) -> None:
    """The line a process started to wait (``apiserver``, ``dagrun``) goes on at
    (``go``, then ``words``); a process that has ended already is not told."""
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        proc.stdin.write(" ".join(("go", *words)).encode() + b"\n")
        proc.stdin.flush()
        proc.stdin.close()


def the_dag(dag_file: Path | str) -> Any:
    """The DAG that ``dag_file`` defines (its first); ValueError saying why there is none."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(dag_file))
    if bag.import_errors:
        raise ValueError(f"{dag_file} does not import:\n" + "\n".join(bag.import_errors.values()))
    if not bag.dags:
        raise ValueError(f"{dag_file} defines no DAG")
    return next(iter(bag.dags.values()))


def end_now(code: int | str | None) -> None:
    """Ends the process without the interpreter's teardown, once its output is flushed:
    a process that imported Airflow spends 1.5 s freeing modules it has no use for at
    exit. Airflow's exit handlers (the ORM's engine, the warnings hook) run first."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        with contextlib.suppress(Exception):
            sys.stderr.write(f"{code}\n")
            sys.stderr.flush()
        code = 1
    os._exit(code)


def run_pipeline(dag: Any, conf: dict[str, Any], logical_date: datetime) -> Any:
    """One DAG run through the LocalExecutor (``dag.test(use_executor=True)``), its
    logical date and run_after ``logical_date`` (so its run_id is known before it
    starts); returns the DagRun."""
    return dag.test(
        logical_date=logical_date,
        run_after=logical_date,
        run_conf=conf or None,
        use_executor=True,
    )
