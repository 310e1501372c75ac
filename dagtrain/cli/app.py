"""The ``dagtrain`` command: run, validate, trigger, up, schema.

    dagtrain run dags/digits_retraining.yaml --set training.epochs=3
    dagtrain validate dags/digits_retraining.yaml
    dagtrain up                                   # api-server, scheduler, dag-processor, triggerer
    dagtrain trigger dagtrain_digits --config dags/digits_retraining.yaml --wait

Airflow is imported only by the commands that need it, after the project's home
(``.dagtrain/``, or ``$DAGTRAIN_HOME``) has been set in the environment.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dagtrain.config import (
    ConfigError,
    PipelineConfig,
    deep_merge,
    load_config,
    merge_conf,
    parse_sets,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="dagtrain: distributed training pipelines on Apache Airflow 3.",
)
out = Console()
err = Console(stderr=True)

Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a field: --set training.epochs=3 (repeatable)"),
]
HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home",
        envvar="DAGTRAIN_HOME",
        help="project-local directory for Airflow's SQLite DB, logs and generated DAGs",
    ),
]


# -P: the current directory stays off sys.path, so a checkout's own metadata
# (airflow_provider_dagtrain.egg-info beside pyproject.toml) is not found as a second
# copy of the provider, whose plugin Airflow would then report as registered twice
AIRFLOW = [sys.executable, "-P", "-m", "airflow"]


def _fail(msg: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    return typer.Exit(code)


def _load(
    config: Path, sets: list[str] | None
) -> tuple[PipelineConfig, dict[str, Any], PipelineConfig]:
    """(the file's config, the --set overrides as a conf, the run's config)."""
    try:
        cfg = load_config(config)
        conf = parse_sets(sets or [])
        return cfg, conf, merge_conf(cfg, conf)
    except ConfigError as e:
        raise _fail(str(e), 2) from None


def _home(home: Path, dags: Path | None = None, port: int = 8080):
    from .embedded import Home

    dags = dags or (Path("dags") if Path("dags").is_dir() else home / "dags")
    return Home(home.resolve(), dags.resolve(), port)


@app.command()
def validate(config: Path, sets: Sets = None) -> None:
    """Check a pipeline config (and --set overrides) without running anything."""
    _, _, eff = _load(config, sets)
    out.print(
        f"[green]ok[/] {config}: pipeline [bold]{eff.name}[/] ({eff.pipeline}), model "
        f"{eff.model.name}, {eff.distributed.ranks} {eff.distributed.backend} rank(s), "
        f"{eff.training.epochs} epoch(s); artifacts in {eff.artifact_root()}",
        highlight=False,
    )


@app.command()
def schema(markdown: Annotated[bool, typer.Option(help="the config reference")] = False) -> None:
    """Print the config's JSON Schema (or, with --markdown, its reference table)."""
    from dagtrain.config import config_schema

    if not markdown:
        out.print_json(json.dumps(config_schema()))
        return
    from dagtrain.docs import config_reference

    sys.stdout.write(config_reference())


def _table(rows, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("stage")
    t.add_column("state")
    t.add_column("try", justify="right")
    t.add_column("seconds", justify="right")
    colour = {"success": "green", "failed": "red", "running": "yellow", "skipped": "dim"}
    for r in rows:
        name = r.task_id if r.map_index < 0 else f"{r.task_id}[{r.map_index}]"
        state = r.state or "waiting"
        t.add_row(
            name,
            f"[{colour.get(state, 'white')}]{state}[/]",
            str(r.try_number),
            "" if r.seconds is None else f"{r.seconds:.1f}",
        )
    return t


@app.command()
def run(
    config: Path,
    sets: Sets = None,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Run a pipeline through Airflow (embedded, SQLite) and print its summary."""
    cfg, conf, eff = _load(config, sets)
    from .embedded import dag_file_for, output_to, run_pipeline

    dag_file = dag_file_for(config.resolve(), cfg, home.resolve())
    h = _home(home, dag_file.parent)
    h.activate()
    from dagtrain.errors import MissingDependency
    from dagtrain.sync import require

    try:  # before Airflow starts: a missing backend fails now, with how to install it
        require(eff.distributed.backend)
    except MissingDependency as e:
        raise _fail(str(e), 2) from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = h.logs / f"run-{cfg.name}-{stamp}.log"
    # airflow's import and migration chatter goes to the log
    with out.status(f"starting Airflow (SQLite metadata in {h.db})"), output_to(log):
        h.migrate()
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(str(dag_file))
    if bag.import_errors:
        raise _fail(f"{dag_file} does not import:\n" + "\n".join(bag.import_errors.values()))
    if not bag.dags:
        raise _fail(f"{dag_file} defines no DAG")
    dag = next(iter(bag.dags.values()))
    out.print(f"running [bold]{dag.dag_id}[/] ({dag_file.name}); Airflow's log: {log}")
    t0 = time.monotonic()
    with Live(_table([], dag.dag_id), console=out, refresh_per_second=4) as live:
        dr, rows = run_pipeline(
            dag, conf, log, h.db, on_poll=lambda rows: live.update(_table(rows, dag.dag_id))
        )
    out.print()
    _summary(eff, dr, rows, time.monotonic() - t0, log)


def _summary(cfg: PipelineConfig, dr, rows, seconds: float, log: Path) -> None:
    from dagtrain.stages.files import read_json, run_dir

    state = str(getattr(dr.state, "value", dr.state))
    run = run_dir(cfg.artifact_root(), dr.run_id)
    out.print(f"run [bold]{dr.run_id}[/]: {state} in {seconds:.1f} s", highlight=False)
    ev = run / "eval.json"
    if ev.exists():
        e = read_json(ev)
        m = e["metrics"]
        out.print(
            f"test accuracy [bold]{m['test_accuracy']:.4f}[/] (loss {m['test_loss']:.4f}, "
            f"{m['test_samples']} samples); {e['reason']}",
            highlight=False,
        )
    from dagtrain.stages.registry import champion

    champ = champion(cfg)
    if champ:
        out.print(
            f"champion (the promoted model): v{champ['version']} {champ['path']} "
            f"(test accuracy {champ['metrics']['test_accuracy']:.4f})",
            highlight=False,
        )
    traces = sorted(run.rglob("traces/*.json"))
    if traces:
        out.print(f"step traces (open in https://ui.perfetto.dev): {traces[0].parent}")
    out.print(f"artifacts: {run}\nAirflow log: {log}", highlight=False)
    if state != "success":
        failed = [r.task_id for r in rows if r.state == "failed"]
        why = _last_error(log)
        raise _fail(
            f"the run {state}; failed stage(s): {', '.join(failed) or '?'}"
            + (f"\n  {why}" if why else "")
            + f"\nAirflow's log of the run: {log}"
        )


_ERROR_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Failure|Input|Timeout)): (.+)$"
)


def _last_error(log: Path) -> str | None:
    """The last exception line a task wrote to the log ("BadInput: data ...")."""
    last = None
    try:
        with open(log, errors="replace") as f:
            for line in f:
                m = _ERROR_LINE.match(line.rstrip("\n"))
                if m:
                    last = f"{m.group(1)}: {m.group(2)}"
    except OSError:
        return None
    return last


@app.command()
def trigger(
    dag_id: str,
    config: Annotated[Path | None, typer.Option(help="a config whose sections become conf")] = None,
    sets: Sets = None,
    url: Annotated[str, typer.Option(envvar="DAGTRAIN_AIRFLOW_URL")] = "http://localhost:8080",
    user: Annotated[str, typer.Option(envvar="DAGTRAIN_AIRFLOW_USER")] = "admin",
    password: Annotated[str | None, typer.Option(envvar="DAGTRAIN_AIRFLOW_PASSWORD")] = None,
    wait: Annotated[bool, typer.Option(help="follow the run until it ends")] = False,
    timeout: Annotated[float | None, typer.Option(help="seconds to --wait")] = None,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Trigger a DAG run on a running Airflow through its REST API (unpausing the DAG)."""
    from .rest import Client, RestError

    conf: dict[str, Any] = {}
    if config is not None:
        import yaml

        _, over, _ = _load(config, sets)
        raw = yaml.safe_load(config.read_text()) or {}
        # what the file states, less what only the DAG's own file may set
        conf = {k: v for k, v in raw.items() if k not in ("name", "pipeline", "artifacts")}
        conf = deep_merge(conf, over)
    elif sets:
        try:  # checked by the server, against the DAG's own config
            conf = parse_sets(sets)
        except ConfigError as e:
            raise _fail(str(e), 2) from None
    if password is None:
        pw_file = home.resolve() / "airflow" / "passwords.json"
        if pw_file.exists():
            password = json.loads(pw_file.read_text()).get(user)
    if password is None:
        raise _fail("no password: give --password (or DAGTRAIN_AIRFLOW_PASSWORD)", 2)
    client = Client(url, user, password)
    try:
        client.login()
        if client.unpause(dag_id):
            out.print(f"{dag_id} was paused (as new DAGs are): unpaused it")
        dr = client.trigger(dag_id, conf)
        out.print(f"triggered [bold]{dag_id}[/] run {dr['dag_run_id']} ({dr.get('state')})")
        if not wait:
            return
        with Live(console=out, refresh_per_second=2) as live:

            def show(run: dict, tis: list) -> None:
                t = Table(title=f"{dag_id} {run['dag_run_id']}: {run.get('state')}")
                t.add_column("stage")
                t.add_column("state")
                t.add_column("seconds", justify="right")
                for ti in tis:
                    name = ti["task_id"] + (
                        f"[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else ""
                    )
                    d = ti.get("duration")
                    t.add_row(name, str(ti.get("state")), "" if d is None else f"{d:.1f}")
                live.update(t)

            final = client.wait(dag_id, dr["dag_run_id"], timeout=timeout, on_poll=show)
        out.print()
    except RestError as e:
        raise _fail(str(e)) from None
    except TimeoutError as e:
        raise _fail(str(e)) from None
    out.print(f"run {final['dag_run_id']}: {final['state']}")
    if final["state"] != "success":
        raise typer.Exit(1)


@app.command()
def up(
    port: Annotated[int, typer.Option(help="the api-server's port")] = 8080,
    dags: Annotated[Path | None, typer.Option(help="DAGs folder (default ./dags)")] = None,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Start an embedded Airflow (api-server, scheduler, dag-processor, triggerer)."""
    h = _home(home, dags, port)
    h.activate()
    env = dict(os.environ)  # activate() put the home's environment there
    with out.status("migrating the metadata database"):
        subprocess.run(
            [*AIRFLOW, "db", "migrate"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    procs: dict[str, subprocess.Popen] = {}
    for name, argv in (
        ("api-server", ["api-server", "--port", str(port)]),
        ("scheduler", ["scheduler"]),
        ("dag-processor", ["dag-processor"]),
        ("triggerer", ["triggerer"]),
    ):
        f = open(h.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        procs[name] = subprocess.Popen(
            [*AIRFLOW, *argv],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stop = {"now": False}

    def on_signal(signum, frame) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if _wait_healthy(port, procs, stop):
            out.print(
                f"Airflow is up: [bold]http://localhost:{port}[/]  user [bold]admin[/] "
                f"password [bold]{h.password()}[/]\nDAGs from {h.dags}; logs in {h.logs}; "
                "Ctrl-C stops it all.",
                highlight=False,
            )
        while not stop["now"]:
            dead = [n for n, p in procs.items() if p.poll() is not None]
            if dead:
                err.print(f"[red]{', '.join(dead)} exited; see {h.logs}[/]")
                break
            time.sleep(0.5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if not stop["now"]:
        raise typer.Exit(1)


def _wait_healthy(port: int, procs: dict, stop: dict, timeout: float = 180.0) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    with out.status("waiting for the api-server"):
        while time.monotonic() < deadline and not stop["now"]:
            if any(p.poll() is not None for p in procs.values()):
                return False
            try:
                r = httpx.get(f"http://localhost:{port}/api/v2/monitor/health", timeout=2)
                if r.status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(1)
    return False


def main() -> None:
    app()


if __name__ == "__main__":
    main()
