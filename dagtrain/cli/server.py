"""``dagtrain up`` (Airflow's api-server, scheduler, dag-processor and triggerer on the
project's home) and ``dagtrain trigger`` (a run through its REST API)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live

from dagtrain.atomic import atomic_write
from dagtrain.config import ConfigError, deep_merge, parse_sets, without_file_only
from dagtrain.rank_env import parent_death_signal

from .common import (
    HomeOpt,
    PasswordOpt,
    Sets,
    UserOpt,
    err,
    fail,
    home_flag,
    home_of,
    load,
    out,
    password_of,
)
from .stop import Interrupts

__all__ = ["trigger", "up"]

DEFAULT_URL = "http://localhost:8080"


def _url_of(home: Path) -> str:
    """The URL of the Airflow that ``dagtrain up`` runs on ``home``, else the default."""
    try:
        return json.loads(home_of(home).up_file.read_text())["url"]
    except (OSError, ValueError, KeyError):
        return DEFAULT_URL


def trigger(
    dag_id: Annotated[
        str,
        typer.Argument(metavar="DAG_ID", help="the DAG to run (e.g. dagtrain_digits)"),
    ],
    config: Annotated[Path | None, typer.Option(help="a config whose sections become conf")] = None,
    sets: Sets = None,
    url: Annotated[
        str | None,
        typer.Option(
            envvar="DAGTRAIN_AIRFLOW_URL",
            help="the api-server (default: the one `dagtrain up` runs on --home, else "
            f"{DEFAULT_URL})",
        ),
    ] = None,
    user: UserOpt = "admin",
    password: PasswordOpt = None,
    wait: Annotated[bool, typer.Option(help="follow the run until it ends")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to --wait at most")] = 12 * 3600.0,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Trigger a DAG run on a running Airflow through its REST API (unpausing the DAG)."""
    from .rest import Client, RestError

    # the run's logs are read where it can be without a login: the home's database when
    # this home's `dagtrain up` serves the run
    via_home = url is None and home_of(home).up_file.exists()
    url = url or _url_of(home)
    conf: dict[str, Any] = {}
    if config is not None:
        import yaml

        _, over, _ = load(config, sets)
        raw = yaml.safe_load(config.read_text()) or {}
        # what the file states, less what only the DAG's own file may set
        conf = deep_merge(without_file_only(raw), over)
    elif sets:
        try:  # checked by the server, against the DAG's own config
            conf = parse_sets(sets)
        except ConfigError as e:
            raise fail(str(e), 2) from None
    client = Client(url, user, password_of(home, user, password))
    try:
        client.login()
        if conf:
            _check_conf(client, dag_id, conf)
        dag = client.unpause(dag_id)
        if dag is not None:
            out.print(f"{dag_id} was paused (as new DAGs are): unpaused it")
            if dag.get("timetable_summary") not in (None, "None", "", "Never"):
                out.print(
                    f"note: {dag_id} is scheduled ({dag['timetable_summary']}): unpaused, "
                    "the scheduler also starts its latest interval's run now"
                )
        dr = client.trigger(dag_id, conf)
        run_id = dr["dag_run_id"]
        out.print(f"triggered {dag_id} run {run_id} ({dr.get('state')})")
        if not wait:
            return
        final = _follow(client, dag_id, run_id, timeout)
        from dagtrain.records.layout import EVALUATE_TASK, PROMOTE_TASK, TRAIN_TASK

        from .summary import outcome_lines

        out.print()
        took = _took(final)
        out.print(f"run {run_id}: {final['state']}{took}")
        lines = outcome_lines(
            client.xcom(dag_id, run_id, TRAIN_TASK),
            client.xcom(dag_id, run_id, EVALUATE_TASK),
            client.xcom(dag_id, run_id, PROMOTE_TASK),
        )
        for line in lines:
            out.print(line)
        where = ("" if via_home else f" --url {url}") + home_flag(home)
        out.print(f"task logs: dagtrain logs {run_id} TASK{where}")
    except RestError as e:
        raise fail(str(e)) from None
    except TimeoutError as e:
        raise fail(str(e)) from None
    if final["state"] != "success":
        failed = [ti for ti in client.task_instances(dag_id, run_id) if ti["state"] == "failed"]
        for ti in failed:
            name = ti["task_id"] + (f"[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else "")
            why = client.error_of(dag_id, run_id, ti) or "no error in its log"
            err.print(f"failed: {name} try {ti.get('try_number')}: {why}")
        raise typer.Exit(1)


def _check_conf(client: Any, dag_id: str, conf: dict[str, Any]) -> None:
    """Refuse, before the run is created, a conf the DAG's own config would refuse, with
    the message `validate` and `run --set` give: checked against the config its Params
    hold (the file's values). A DAG whose Params are not a dagtrain config: the server
    alone judges."""
    from dagtrain.config import merge_conf, validate

    params = client.params(dag_id)
    if not params:
        return
    try:
        base = validate(params, f"{dag_id}'s config")
    except ConfigError:
        return  # not a dagtrain pipeline's Params
    try:
        merge_conf(base, conf)
    except ConfigError as e:
        raise fail(f"refused the run's conf, no run was created: {e}", 2) from None


def _follow(client: Any, dag_id: str, run_id: str, timeout: float) -> dict[str, Any]:
    """Show the run as `dagtrain run` does (a line as each task starts and ends and as
    each epoch ends; in a terminal, the tasks' table under them) until it ends; return
    the run. TimeoutError after ``timeout`` seconds."""
    import contextlib

    from .follow import RestFollower, task_order
    from .progress import Display

    progress = Display(out, f"{dag_id}  {run_id}", None, None, task_order(client.tasks(dag_id)))
    follower = RestFollower(client, dag_id, run_id)
    out.print("following it (Ctrl-C stops following; the run goes on)")
    live = (
        Live(get_renderable=progress.table, console=out, refresh_per_second=2)
        if out.is_terminal
        else contextlib.nullcontext()
    )
    deadline = time.monotonic() + timeout
    with live:
        while True:
            run, events, metrics = follower.poll()
            progress.feed(events, metrics)
            if run.get("state") in ("success", "failed"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} of {dag_id} still {run.get('state')}")
            time.sleep(2)
        progress.settle(follower.states())
    return run


def _took(run: dict[str, Any]) -> str:
    from .follow import unix_seconds

    start, end = unix_seconds(run.get("start_date")), unix_seconds(run.get("end_date"))
    return f" in {end - start:.1f} s" if start and end else ""


def up(
    port: Annotated[int, typer.Option(help="the api-server's port")] = 8080,
    host: Annotated[
        str, typer.Option(help="the address it listens on (0.0.0.0: every interface)")
    ] = "127.0.0.1",
    dags: Annotated[Path | None, typer.Option(help="DAGs folder (default ./dags)")] = None,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Start an embedded Airflow (api-server, scheduler, dag-processor, triggerer)."""
    from .embedded import AIRFLOW, USER, stop_all

    h = home_of(home, dags, port, host)
    h.activate()
    env = dict(os.environ)  # activate() put the home's environment there
    out.print(f"migrating the metadata database {h.db}", highlight=False)
    subprocess.run(
        [*AIRFLOW, "db", "migrate"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs: dict[str, subprocess.Popen] = {}
    deadline = _StopDeadline(procs)
    stop = Interrupts(lambda count: count == 1 and deadline.start()).install()
    try:
        # Airflow's own log servers listen on every interface: one of ours instead, on
        # the UI's address (dagtrain.cli.logserver)
        logs = [sys.executable, "-P", "-m", "dagtrain.cli.logserver", host, str(h.own_port + 1)]
        for name, argv in (
            ("api-server", [*AIRFLOW, "api-server", "--host", host, "--port", str(port)]),
            ("scheduler", [*AIRFLOW, "scheduler", "--skip-serve-logs"]),
            ("dag-processor", [*AIRFLOW, "dag-processor"]),
            ("triggerer", [*AIRFLOW, "triggerer", "--skip-serve-logs"]),
            ("log server", logs),
        ):
            log = h.logs / f"{name.replace(' ', '-')}.log"
            out.print(f"starting the {name} (log: {log})", highlight=False)
            with open(log, "ab") as f:
                procs[name] = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the terminal's Ctrl-C is ours to pass on
                    # and if this process is killed outright, they stop with it
                    preexec_fn=parent_death_signal(signal.SIGTERM),  # noqa: PLW1509 (a bare prctl)
                )
        if _wait_healthy(h.execution_url, procs, lambda: stop.count > 0):
            h.up_file.write_text(json.dumps({"url": h.url, "pid": os.getpid()}))
            # kept after it stops: the address later runs' links name (MLflow's tags)
            atomic_write(h.ui_file, json.dumps({"url": h.url, "port": h.port}).encode())
            out.print(
                f"Airflow is up: {h.url}  user {USER}  password {h.password()}\n"
                f"DAGs from {h.dags}; logs in {h.logs}; Ctrl-C stops it all.",
                highlight=False,
            )
        while not stop.count:
            dead = [n for n, p in procs.items() if p.poll() is not None]
            if dead:
                err.print(f"{', '.join(dead)} exited; see {h.logs}", style="red")
                break
            time.sleep(0.5)
    finally:
        h.up_file.unlink(missing_ok=True)
        out.print("stopping Airflow ...", highlight=False)
        deadline.begun.set()
        stop_all(list(procs.values()))
        deadline.stopped.set()
        out.print("Airflow stopped; nothing it started is left running", highlight=False)
    if not stop.count:
        raise typer.Exit(1)


# how long after Ctrl-C, SIGTERM or SIGHUP `up` may take to say it is stopping, and to
# print its last line once everything has stopped
STOP_SAYS_WITHIN = 5.0


class _StopDeadline:
    """The deadline of a stop that was asked for (``start()``, from the signal handler),
    for a ``up`` blocked writing to a terminal that takes no more output (paused with
    Ctrl-S, or gone without a SIGHUP): if it has not said it is stopping (``begun``)
    ``STOP_SAYS_WITHIN`` seconds after the signal, or not stopped Airflow (``stopped``)
    within ``stop_all``'s grace after that, Airflow is stopped from a thread that prints
    nothing and the process exits (status 1); once Airflow has stopped, the process
    exits (status 0) if its last line cannot be printed within ``STOP_SAYS_WITHIN``."""

    def __init__(self, procs: dict[str, subprocess.Popen]) -> None:
        self.procs = procs
        self.begun = threading.Event()
        self.stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="stop-deadline", daemon=True).start()

    def _watch(self) -> None:
        from .embedded import STOP_GRACE, stop_all

        if not self.begun.wait(STOP_SAYS_WITHIN) or not self.stopped.wait(STOP_GRACE + 10):
            stop_all(list(self.procs.values()), grace=10.0)
            os._exit(1)
        time.sleep(STOP_SAYS_WITHIN)
        os._exit(0)


def _wait_healthy(
    url: str, procs: dict, stopped: Callable[[], bool], timeout: float = 180.0
) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    with out.status(f"waiting for the api-server at {url}"):
        while time.monotonic() < deadline and not stopped():
            if any(p.poll() is not None for p in procs.values()):
                return False
            try:
                r = httpx.get(f"{url}/api/v2/monitor/health", timeout=2)
                if r.status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(1)
    if not stopped():
        err.print(f"the api-server did not answer within {timeout:g} s; see its log")
    return False
