"""``dagtrain logs RUN_ID [TASK]``: a run's task logs, a line per record, as the web UI
shows them.

    dagtrain logs manual__2026-12-01T10:00:00+00:00              # every task, newest try
    dagtrain logs manual__2026-12-01T10:00:00+00:00 train --try 1
    dagtrain logs scheduled__2026-12-01T00:00:00+00:00 'round_0_train[1]' --url http://host:8080

Two sources. Without ``--url``: the embedded home's metadata database (the run and its
task instances through Airflow's ORM, the text through Airflow's ``TaskLogReader``, as
the api-server reads it). With ``--url``: a running Airflow's REST API
(``GET .../taskInstances/{task}/logs/{try}``). Both give Airflow 3's structured records
(timestamp, level, logger, event, error_detail, ...); nothing here parses log text.

``log_files(dag_id, run_id)``: where Airflow keeps each try's log file, for summaries.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from rich.text import Text

from .common import HomeOpt, PasswordOpt, UserOpt, fail, home_of, out, password_of
from .progress import dag_order as tasks_in_order

__all__ = ["format_record", "log_files", "logs"]

_LABEL = re.compile(r"^(?P<task>[^\[\]]+)(?:\[(?P<index>\d+)\])?$")
# what the web UI leaves out of a record's key=value tail: the task instance's identity,
# the source location, and (too long to read) the task instance's repr
_HIDDEN = {
    *("ti_id", "dag_id", "task_id", "run_id", "try_number", "map_index"),
    *("logger", "chan", "lineno", "filename", "loc", "ti"),
    *("timestamp", "level", "event", "error_detail"),
}
_SOURCES = "Log message source details"
_LEVEL_STYLE = {"error": "red", "critical": "bold red", "warning": "yellow", "debug": "dim"}
_STATE_STYLE = {"success": "green", "failed": "red", "up_for_retry": "magenta"}


@dataclass
class TaskTries:
    """One task instance of a run (a mapped task has one per index) and its tries."""

    task_id: str
    map_index: int = -1
    state: str | None = None
    tries: list[int] = field(default_factory=list)  # ascending; empty: it never ran
    started: str = ""  # ISO time of its newest try's start ("" if none): ties in DAG order

    @property
    def label(self) -> str:
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


# ---------------------------------------------------------------------- ordering
def tries_in_order(tis: list[TaskTries], downstream: dict[str, Iterable[str]]) -> list[TaskTries]:
    """``tis`` in the DAG's order: upstream tasks first (of tasks ready together, the one
    that started first; then by id), a mapped task's indexes ascending; task instances
    of tasks the DAG no longer has last."""
    first: dict[str, str] = {}
    for t in tis:
        key = t.started or "~"  # never started: after those that did
        first[t.task_id] = min(first.get(t.task_id, key), key)
    order = tasks_in_order(downstream, tie=lambda tid: (first.get(tid, "~"), tid))
    rank = {tid: k for k, tid in enumerate(order)}
    return sorted(
        tis,
        key=lambda t: (rank.get(t.task_id, len(rank)), first[t.task_id], t.task_id, t.map_index),
    )


# ---------------------------------------------------------------------- formatting
def _time(value: Any) -> str:
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, str) and value:
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    else:
        return ""
    if when.utcoffset():
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _exception(detail: list[Any]) -> list[str]:
    """An ``error_detail`` (structlog's exception dicts, the raised one first, then what
    caused it) as Python prints a traceback: the cause first."""
    lines: list[str] = []
    excs = [d for d in detail if isinstance(d, dict)]
    for i, exc in enumerate(reversed(excs)):
        if i:
            lines += [
                "",
                "The above exception was the direct cause of the following exception:"
                if excs[len(excs) - i].get("is_cause")
                else "During handling of the above exception, another exception occurred:",
                "",
            ]
        frames = [f for f in exc.get("frames") or [] if isinstance(f, dict)]
        if frames:
            lines.append("Traceback (most recent call last):")
            for f in frames:
                lines.append(
                    f'  File "{f.get("filename")}", line {f.get("lineno")}, in {f.get("name")}'
                )
        value = str(exc.get("exc_value") or "")
        lines += f"{exc.get('exc_type')}: {value}".rstrip().split("\n")
        lines += [str(n) for n in exc.get("exc_notes") or []]
    return lines


def _short(logger: str) -> str:
    """An operator's logger (``airflow.task.operators.<module>.<Class>``) by its class,
    as the web UI's line would be read: the rest is the same for every line of a task."""
    prefix = "airflow.task.operators."
    return logger.rpartition(".")[2] if logger.startswith(prefix) else logger


def format_record(rec: dict[str, Any] | str) -> list[Text]:
    """One structured log record as lines a person reads: ``time LEVEL logger: event``
    then the record's other fields as ``key=value`` (those the web UI shows), and for an
    error record, its exception as a traceback."""
    if isinstance(rec, str):
        return [Text(rec)]
    level = str(rec.get("level") or "")
    head = Text()
    if when := _time(rec.get("timestamp")):
        head.append(when + " ")
    if level:
        head.append(f"{level.upper():<7} ", style=_LEVEL_STYLE.get(level.lower()))
    if rec.get("logger"):
        head.append(f"{_short(str(rec['logger']))}: ", style="dim")
    event = str(rec.get("event", ""))
    if event.startswith("::group::"):
        event = "▸ " + event.removeprefix("::group::")
    head.append(event)
    for k, v in rec.items():
        if k not in _HIDDEN and v is not None:
            head.append(f" {k}={v}", style="dim")
    lines = [head]
    detail = rec.get("error_detail")
    if isinstance(detail, list) and detail:
        lines += [Text(f"    {line}" if line else "", style="red") for line in _exception(detail)]
    return lines


def _readable(records: Iterable[dict[str, Any] | str]) -> tuple[list[dict | str], list[str]]:
    """(the records worth showing, the log's sources): the source-details group (where
    the reader found the text) is taken out, as are the end-of-group markers."""
    shown: list[dict | str] = []
    sources: list[str] = []
    in_sources = False
    for rec in records:
        event = rec.get("event") if isinstance(rec, dict) else rec
        if event == f"::group::{_SOURCES}":
            in_sources = True
        elif event == "::endgroup::":
            in_sources = False
        elif in_sources:
            sources.append(str(event))
        else:
            shown.append(rec)
    return shown, sources


# ---------------------------------------------------------------------- sources
@contextlib.contextmanager
def _airflow_speaks_on_stderr() -> Iterator[None]:
    """Airflow's own console logging (set up at its import, its loggers bound when first
    used: a plugin's warning, say) goes to stderr; stdout carries the task log alone."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _on_stderr(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with _airflow_speaks_on_stderr():
            return method(*args, **kw)

    return wrapper


class _Embedded:
    """The embedded home's Airflow, through its ORM and its TaskLogReader."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.dag: Any = None  # the run's DAG (its version), once task_tries read it

    @_on_stderr
    def dags_of(self, run_id: str) -> list[str]:
        from dagtrain.plugins import queries

        return queries.dag_ids_of_run(self.session, run_id)

    @_on_stderr
    def recent(self, dag_id: str | None, limit: int = 5) -> list[tuple[str, str]]:
        from dagtrain.plugins import queries

        return [(r.dag_id, r.run_id) for r in queries.recent_runs(self.session, dag_id, limit)]

    @_on_stderr
    def task_tries(self, dag_id: str, run_id: str) -> list[TaskTries] | None:
        return _task_tries(self.session, dag_id, run_id, self)

    def tries_of(self, dag_id: str, run_id: str, t: TaskTries) -> list[int]:
        return t.tries

    @_on_stderr
    def records(self, dag_id: str, run_id: str, t: TaskTries, n: int) -> list[dict | str]:
        import logging

        from airflow.exceptions import TaskNotFound
        from airflow.utils.log.log_reader import TaskLogReader

        from dagtrain.plugins import queries

        # as the api-server does: the task instance if it is at that try, else its history
        ti = queries.task_try(self.session, dag_id, run_id, t.task_id, t.map_index, n)
        if ti is None:
            return []
        if self.dag is not None:
            with contextlib.suppress(TaskNotFound):
                ti.task = self.dag.get_task(ti.task_id)
        reader = TaskLogReader()
        if not reader.supports_read:
            raise fail("Airflow's task log handler here cannot read logs; give --url", 2)
        # a running task's text is also asked of its worker's log server: if that cannot
        # be reached, the reader says so among the sources, and need not print a traceback
        logging.getLogger("airflow.utils.log.file_task_handler").setLevel(logging.CRITICAL)
        stream, _ = reader.read_log_chunks(ti, n, {"download_logs": True})  # type: ignore[arg-type]
        return [m.model_dump(mode="json") if hasattr(m, "model_dump") else m for m in stream]


def _task_tries(
    session: Any, dag_id: str, run_id: str, src: _Embedded | None
) -> list[TaskTries] | None:
    """The run's task instances with their tries (history and current), in DAG order;
    None if there is no such run."""
    from airflow.models.dagbag import DBDagBag

    from dagtrain.plugins import queries

    run = queries.dag_run(session, dag_id, run_id)
    if run is None:
        return None
    by_key: dict[tuple[str, int], TaskTries] = {}
    for ti in queries.task_instances(session, dag_id, run_id):
        by_key[(ti.task_id, ti.map_index)] = TaskTries(
            ti.task_id,
            ti.map_index,
            queries.state_text(ti.state),
            [ti.try_number] if ti.try_number else [],
            ti.start_date.isoformat() if ti.start_date else "",
        )
    for task_id, map_index, n in queries.earlier_tries(session, dag_id, run_id):
        t = by_key.setdefault((task_id, map_index), TaskTries(task_id, map_index))
        if n and n not in t.tries:
            t.tries.append(n)
    for t in by_key.values():
        t.tries.sort()
    dag = DBDagBag().get_dag_for_run(run, session=session)
    if src is not None:
        src.dag = dag
    downstream = {} if dag is None else {k: v.downstream_task_ids for k, v in dag.task_dict.items()}
    return tries_in_order(list(by_key.values()), downstream)


class _Rest:
    """A running Airflow's REST API: runs, task instances, tries and logs (through
    ``dagtrain.cli.rest``, imported only when used: it brings httpx)."""

    def __init__(self, url: str, user: str, password: str) -> None:
        from .rest import Client

        self.client = Client(url, user, password)

    def _get(self, path: str, **kw: Any) -> Any:
        from .rest import RestError, detail

        r = self.client._send("GET", path, **kw)
        user = self.client.user
        if r.status_code in (401, 403):
            raise RestError(f"user {user!r} may not read {path}: {detail(r)}")
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise RestError(f"GET {path} failed ({r.status_code}): {detail(r)}")
        return r.json()

    def _pages(self, path: str, key: str, **params: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for _ in range(1000):  # pages of 100: a run with more task instances is cut there
            page = self._get(path, params={**params, "limit": 100, "offset": len(rows)})
            got = (page or {}).get(key) or []
            rows += got
            if not got or len(rows) >= int((page or {}).get("total_entries") or 0):
                return rows
        return rows

    def dags_of(self, run_id: str) -> list[str]:
        runs = self._pages("/api/v2/dags/~/dagRuns", "dag_runs", run_id_pattern=run_id)
        return sorted({r["dag_id"] for r in runs if r.get("dag_run_id") == run_id})

    def recent(self, dag_id: str | None, limit: int = 5) -> list[tuple[str, str]]:
        got = self._get(
            f"/api/v2/dags/{dag_id or '~'}/dagRuns",
            params={"order_by": "-run_after", "limit": limit},
        )
        return [(r["dag_id"], r["dag_run_id"]) for r in (got or {}).get("dag_runs") or []]

    def task_tries(self, dag_id: str, run_id: str) -> list[TaskTries] | None:
        if self._get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}") is None:
            return None
        tis = self._pages(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances")
        rows = [
            TaskTries(
                ti["task_id"],
                int(ti.get("map_index", -1)),
                ti.get("state"),
                list(range(1, int(ti.get("try_number") or 0) + 1)),
                ti.get("start_date") or "",
            )
            for ti in tis
        ]
        tasks = (self._get(f"/api/v2/dags/{dag_id}/tasks") or {}).get("tasks") or []
        return tries_in_order(
            rows, {t["task_id"]: t.get("downstream_task_ids") or [] for t in tasks}
        )

    def tries_of(self, dag_id: str, run_id: str, t: TaskTries) -> list[int]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{t.task_id}/tries"
        got = self._get(path, params={"map_index": t.map_index}) or {}
        return sorted({n for ti in got.get("task_instances") or [] if (n := ti.get("try_number"))})

    def records(self, dag_id: str, run_id: str, t: TaskTries, n: int) -> list[dict | str]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{t.task_id}/logs/{n}"
        got = self._get(
            path,
            params={"map_index": t.map_index, "full_content": True},
            headers={"Accept": "application/json"},
        )
        return list((got or {}).get("content") or [])


# ---------------------------------------------------------------------- the command
def _select(tis: list[TaskTries], task: str) -> list[TaskTries]:
    m = _LABEL.match(task.strip())
    names = ", ".join(dict.fromkeys(t.label for t in tis)) or "none"
    if m is None:
        raise fail(f"{task!r} is not a task: give TASK or TASK[INDEX]; this run's: {names}", 2)
    chosen = [t for t in tis if t.task_id == m["task"]]
    if not chosen:
        raise fail(f"the run has no task {m['task']!r}; its tasks: {names}", 2)
    if m["index"] is not None:
        index = int(m["index"])
        indexes = ", ".join(str(t.map_index) for t in chosen if t.map_index >= 0)
        chosen = [t for t in chosen if t.map_index == index]
        if not chosen:
            raise fail(
                f"{m['task']} has no map index {index}"
                + (f"; its indexes: {indexes}" if indexes else " (it is not a mapped task)"),
                2,
            )
    return chosen


def _show(src: Any, dag_id: str, run_id: str, t: TaskTries, n: int | None) -> None:
    """One task instance's try: a header line, then its records."""
    if n is None:
        ended = t.state in ("upstream_failed", "skipped", "removed", "failed", "success")
        what = "did not run" if ended else "has not run yet"
        out.print(Text.assemble((t.label, "bold"), f": {what} ({t.state or 'no state'})"))
        return
    shown, sources = _readable(src.records(dag_id, run_id, t, n))
    tries = f"try {n}" if len(t.tries) < 2 else f"try {n} (tries {', '.join(map(str, t.tries))})"
    head = Text.assemble((t.label, "bold"), f"  {tries}")
    if n == max(t.tries) and t.state:
        head.append("  ")
        head.append(t.state, style=_STATE_STYLE.get(t.state))
    if sources:
        head.append("  " + ", ".join(sources), style="dim")
    out.print(head)
    for rec in shown:
        for line in format_record(rec):
            out.print(line)
    if not shown:
        out.print("(the log is empty)", style="dim")


def _no_run(src: Any, run_id: str, dag_id: str | None, where: str) -> typer.Exit:
    of = f" of DAG {dag_id!r}" if dag_id else ""
    recent = src.recent(dag_id)
    hint = (
        "; its newest runs: " + ", ".join(r if dag_id else f"{r} ({d})" for d, r in recent)
        if recent
        else f"; {where} has no runs{of} yet"
    )
    return fail(f"no run {run_id!r}{of} in {where}: check the run id{hint}", 2)


def _dag_of(src: Any, run_id: str, dag: str | None, where: str) -> str:
    if dag is not None:
        return dag
    dags = src.dags_of(run_id)
    if not dags:
        raise _no_run(src, run_id, None, where)
    if len(dags) > 1:
        raise fail(f"run {run_id!r} exists in several DAGs ({', '.join(dags)}): give --dag", 2)
    return dags[0]


def _print_logs(
    src: Any, run_id: str, task: str | None, try_: int | None, dag: str | None, where: str
) -> None:
    dag_id = _dag_of(src, run_id, dag, where)
    tis = src.task_tries(dag_id, run_id)
    if tis is None:
        raise _no_run(src, run_id, dag_id, where)
    if not tis:
        raise fail(f"run {run_id!r} of {dag_id} has no task instances (yet)", 2)
    chosen = tis if task is None else _select(tis, task)
    if try_ is not None:
        if len(chosen) != 1:
            labels = ", ".join(t.label for t in chosen)
            raise fail(f"--try picks one task instance's try: give one TASK ({labels})", 2)
        t = chosen[0]
        t.tries = src.tries_of(dag_id, run_id, t) or t.tries
        if try_ not in t.tries:
            have = ", ".join(map(str, t.tries)) or "none, it never ran"
            raise fail(f"{t.label} has no try {try_}; its tries: {have}", 2)
    for i, t in enumerate(chosen):
        if i:
            out.print()
        _show(src, dag_id, run_id, t, try_ if try_ is not None else max(t.tries, default=None))


def logs(
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", help="the run (dagtrain run prints it)")
    ],
    task: Annotated[
        str | None,
        typer.Argument(
            metavar="TASK", help="a task (TASK[INDEX] for a mapped one); default: every task"
        ),
    ] = None,
    try_: Annotated[
        int | None, typer.Option("--try", min=1, help="that try (default: the newest)")
    ] = None,
    dag: Annotated[
        str | None, typer.Option(help="the DAG (default: the one that has RUN_ID)")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            envvar="DAGTRAIN_AIRFLOW_URL",
            help="read through this api-server's REST API (default: the home's database)",
        ),
    ] = None,
    user: UserOpt = "admin",
    password: PasswordOpt = None,
    home: HomeOpt = Path(".dagtrain"),
) -> None:
    """Print a run's task logs, a line per record as the web UI shows them (every task in
    the DAG's order, each its newest try, unless TASK / --try say otherwise)."""
    h = home_of(home)
    if url:
        from .rest import RestError

        client = _Rest(url, user, password_of(home, user, password))
        try:
            client.client.login()
            _print_logs(client, run_id, task, try_, dag, url)
        except RestError as e:
            raise fail(str(e)) from None
        return
    if not h.db.exists():
        raise fail(
            f"no Airflow database at {h.db}: run a pipeline there first "
            f"(dagtrain run CONFIG --home {home}), or read a running Airflow with --url",
            2,
        )
    h.activate()
    with _airflow_speaks_on_stderr():
        from airflow.utils.session import create_session

    with create_session() as session:
        _print_logs(_Embedded(session), run_id, task, try_, dag, f"home {h.root}")


# ---------------------------------------------------------------------- log files
def log_files(dag_id: str, run_id: str) -> list[tuple[str, int, Path]]:
    """(task label, try number, log file) for every try Airflow has of every task of the
    run, in the DAG's order, where Airflow's task log handler keeps them (``[logging]
    base_log_folder`` and ``log_filename_template``). A file may be missing (a try that
    ended before it wrote one). Call it after the home was activated."""
    from airflow.configuration import conf
    from airflow.utils.helpers import log_filename_template_renderer
    from airflow.utils.session import create_session

    from dagtrain.plugins import queries

    base = Path(conf.get("logging", "base_log_folder")).expanduser().resolve()
    render = log_filename_template_renderer()
    with create_session() as session:
        run = queries.dag_run(session, dag_id, run_id)
        if run is None:
            return []
        logical_date = run.logical_date or run.run_after
        tis = _task_tries(session, dag_id, run_id, None)
    files = []
    for t in tis:
        for n in t.tries:
            ti = SimpleNamespace(
                dag_id=dag_id,
                run_id=run_id,
                task_id=t.task_id,
                map_index=t.map_index,
                try_number=n,
                logical_date=logical_date,
            )
            files.append((t.label, n, base / render(ti=ti, try_number=n)))
    return files
