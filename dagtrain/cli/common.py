"""What the ``dagtrain`` commands share: the consoles, options, config loading, and the
checks a run would fail on at once."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from dagtrain.config import (
    HOME_VARIABLE,
    ConfigError,
    PipelineConfig,
    load_config,
    merge_conf,
    parse_sets,
)
from dagtrain.errors import InputError, MissingDependency

__all__ = [
    "ConfigArg",
    "HomeOpt",
    "PasswordOpt",
    "Sets",
    "UserOpt",
    "Unbroken",
    "err",
    "fail",
    "home_flag",
    "home_of",
    "ModelCheck",
    "load",
    "out",
    "password_of",
    "preflight",
    "start_preflight",
]


class Unbroken:
    """A text stream whose reader may go away — ``dagtrain up | tee log`` and Ctrl-C:
    the terminal's SIGINT ends ``tee`` too; a terminal that hangs up (EIO) — without
    taking the command's cleanup with it: what is written after the reader left is
    dropped, not raised (and the stream's descriptor is pointed at /dev/null, so the
    interpreter's last flush is quiet).
    ``stream``: the stream, or a function giving it (``sys.stdout`` as it is then:
    tests swap it). While a rich display (a status spinner, a live table) runs,
    ``sys.stdout`` and ``sys.stderr`` are its proxies, which write to this console: the
    stream is what they proxy, or a write would go round that loop for ever."""

    def __init__(self, stream: IO[str] | Callable[[], IO[str]]) -> None:
        self._stream = stream
        self.gone = False

    @property
    def stream(self) -> IO[str]:
        stream = self._stream() if callable(self._stream) else self._stream
        while hasattr(stream, "rich_proxied_file"):  # rich.file_proxy.FileProxy
            stream = stream.rich_proxied_file
        return stream

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except (OSError, ValueError):  # a closed pipe, a hung-up terminal
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except (OSError, ValueError):  # a closed pipe, a hung-up terminal
                self._left()

    def _left(self) -> None:
        self.gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's buffer)
            pass

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except ValueError:
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")


# soft: a long path stays one line, whole when copied. No markup: what is printed is
# often text the CLI did not write (a path, an error, "pip install 'x[train]'"); style
# is given as such (style=, Text)
out = Console(file=Unbroken(lambda: sys.stdout), soft_wrap=True, markup=False, highlight=False)
err = Console(file=Unbroken(lambda: sys.stderr), soft_wrap=True, markup=False, highlight=False)

Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="override a field: --set training.epochs=3 (repeatable)"
    ),
]
ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="a pipeline config file (YAML)")]
HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home",
        envvar=HOME_VARIABLE,
        help="project-local directory for Airflow's SQLite DB, logs and generated DAGs",
    ),
]

UserOpt = Annotated[
    str,
    typer.Option(envvar="DAGTRAIN_AIRFLOW_USER", help="the Airflow user to log in as"),
]
PasswordOpt = Annotated[
    str | None,
    typer.Option(
        envvar="DAGTRAIN_AIRFLOW_PASSWORD",
        help="its password (default: the one dagtrain up made in --home, for admin)",
    ),
]


def password_of(home: Path, user: str, password: str | None) -> str:
    """The password given, else the one ``dagtrain up`` made for ``user`` in ``home``."""
    if password is None:
        import json

        with contextlib.suppress(OSError, ValueError, AttributeError):
            password = json.loads(home_of(home).passwords.read_text()).get(user)
    if password is None:
        raise fail("no password: give --password (or DAGTRAIN_AIRFLOW_PASSWORD)", 2)
    return password


def fail(msg: str, code: int = 1) -> typer.Exit:
    err.print(Text.assemble(("error:", "bold red"), f" {msg}"))
    return typer.Exit(code)


def load(
    config: Path, sets: list[str] | None
) -> tuple[PipelineConfig, dict[str, Any], PipelineConfig]:
    """(the file's config, the --set overrides as a conf, the run's config)."""
    try:
        cfg = load_config(config)
        conf = parse_sets(sets or [])
        return cfg, conf, merge_conf(cfg, conf, "--set")
    except ConfigError as e:
        raise fail(str(e), 2) from None


def preflight(cfg: PipelineConfig, home: Path | None = None) -> None:
    """What a run of ``cfg`` would fail on at once, checked here and now (``start_preflight``,
    then the model check's verdict). Exits 2 naming the field."""
    check = start_preflight(cfg, home)
    try:
        check.verdict()
    except (InputError, MissingDependency) as e:
        raise fail(str(e), 2) from None


def start_preflight(cfg: PipelineConfig, home: Path | None = None) -> ModelCheck:
    """The checks that take no time, here and now: the data file, the backend's library,
    the MLflow client when the pipeline has ``tracking`` (its connection is read when
    each task starts); exits 2 naming the field. Returns the model check, started in its
    own process (``ModelCheck``), whose ``verdict()`` is the rest."""
    from dagtrain.config import INIT_KINDS
    from dagtrain.phases.sources import check_source
    from dagtrain.phases.train import init_file
    from dagtrain.sync import require
    from dagtrain.tracking import require_client

    try:
        check_source(cfg)
        if cfg.training.init not in INIT_KINDS:  # a model file the DAG's author names
            init_file(cfg)
        require(cfg.distributed.backend)
        require_client(cfg)
        return ModelCheck(cfg, home)
    except (InputError, MissingDependency) as e:
        raise fail(str(e), 2) from None


class ModelCheck:
    """In a process that imports as the ranks will (``dagtrain.training.driver.preflight``), the
    data's labels, the model factory, the model built with ``model.args`` on the meta
    device (and cut as ``parallel`` says), ``distributed.device``: started at once,
    so that ``dagtrain run`` starts Airflow's processes while it runs (seconds: it
    imports torch)."""

    TIMEOUT = 300.0

    def __init__(self, cfg: PipelineConfig, home: Path | None) -> None:
        import importlib.util
        import json
        import signal
        import subprocess

        from dagtrain.phases.train import code_path
        from dagtrain.rank_env import parent_death_signal

        if importlib.util.find_spec("torch") is None:
            raise MissingDependency(
                "training needs torch, which is not installed in this environment "
                f"({sys.prefix}): pip install 'airflow-provider-dagtrain[train]'"
            )
        self.name = cfg.model.name
        self.cfg = cfg
        plugins = (home or Path(".dagtrain")).resolve() / "airflow" / "plugins"
        spec = {
            "model": cfg.model.model_dump(mode="json"),
            "parallel": cfg.parallel.model_dump(mode="json"),
            "data": cfg.data_source(),
            "data_workers": cfg.data.workers,
            "objective": cfg.objective.model_dump(mode="json"),
            "sequence_length": cfg.data.sequence_length,
            "vocab_size": cfg.data.vocab_size,
            "metric": cfg.evaluation.metric,
            "early_stopping_metric": cfg.training.early_stopping.metric
            if cfg.training.early_stopping
            else None,
            "precision": cfg.training.precision,
            # the ranks of a host list run elsewhere: their devices are theirs to check
            "device": "cpu"
            if cfg.distributed.hosts or cfg.distributed.hosts_connection
            else cfg.distributed.device,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagtrain.training.driver.preflight", json.dumps(spec)],
            env={**os.environ, **code_path(cfg.base_dir, plugins)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # the terminal's Ctrl-C is the command's to handle, not the check's: it ends
            # in seconds, and dies with the command (SIGKILL on a second Ctrl-C)
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGKILL),  # noqa: PLW1509 (a bare prctl)
        )
        self.started = time.monotonic()

    def verdict(self, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Waits for the check: True when it passed; raises InputError naming the field
        when it did not (or did not finish within ``TIMEOUT`` seconds); False, the
        check stopped, once ``cancelled()``."""
        import json
        import subprocess

        while True:
            try:
                stdout, stderr = self.proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if cancelled():
                    self.stop()
                    return False
                if time.monotonic() - self.started > self.TIMEOUT:
                    self.stop()
                    raise InputError(
                        f"checking model.name {self.name!r} and data.source took over "
                        f"{self.TIMEOUT:g} s (importing the factory, or reading the data): "
                        "look at what they do at import"
                    ) from None
        lines = stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        if not isinstance(result, dict):
            tail = "\n".join((stderr or stdout).strip().splitlines()[-8:])
            raise InputError(
                f"the check of model.name {self.name!r} and data.source did not finish "
                f"(exit code {self.proc.returncode}); its last lines:\n{tail}"
            )
        if not result.get("ok"):
            raise InputError(str(result.get("error")))
        if result.get("samples") and self.cfg.pipeline == "retraining":
            from dagtrain.phases.prep import split_sizes

            # the run's steps, on the training split the data-prep phase will cut
            t = self.cfg.training
            t.check_warmup(t.steps(split_sizes(result["samples"], self.cfg.data)[2]))
        return True

    def stop(self) -> None:
        """The check's process (and its session) killed, if it still runs."""
        import signal

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()


def home_flag(home: Path) -> str:
    """`` --home DIR`` for a command printed to be run again; empty for the default."""
    return "" if home.resolve() == Path(".dagtrain").resolve() else f" --home {home.resolve()}"


def home_of(home: Path, dags: Path | None = None, port: int = 8080, host: str = "127.0.0.1"):
    from .embedded import Home

    dags = dags or (Path("dags") if Path("dags").is_dir() else home / "dags")
    return Home(home.resolve(), dags.resolve(), port, host)
