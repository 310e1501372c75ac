"""Which rank this process is, as its launcher said in the environment, and what it is
doing, as data for the launcher: one status record per rank.

The one module both ``dagtrain.launch`` (which sets these variables and reads the
records) and the ranks (which read them before any backend is initialised) import.
Standard library only, and the project's base modules.

The status record: ``<STATUS_DIR>/rank<N>.json``, one JSON object per rank, rewritten
whole and atomically (``dagtrain.atomic``) each time, every write merging into what the
rank wrote before; its fields, and who sets them when, are
:class:`dagtrain.records.status.RankRecord`'s, and its one reader is
:func:`dagtrain.records.status.read_records`.

A death by signal writes nothing: the launcher knows it from the exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagtrain.atomic import atomic_write
from dagtrain.errors import FAIL_FAST
from dagtrain.records.names import RANK_RECORD
from dagtrain.records.status import FIELDS

__all__ = [
    "CODE_PATH",
    "FIRST_COLLECTIVE",
    "JOB_ID",
    "ON_HOST",
    "RANK_VARIABLES",
    "REGROW",
    "STATUS_DIR",
    "StatusRecord",
    "die_with_parent",
    "env_rank",
    "mark_ready",
    "on_stop",
    "parent_death_signal",
    "record_path",
    "report_failure",
    "start_rank",
    "stopping",
    "this_rank",
    "use_code_path",
]

# folders a DAG author's modules live in (the DAG file's, the config's, Airflow's plugins
# folder), for the ranks: appended to sys.path once the rank's own imports are done,
# after the installed packages, as Airflow appends its DAGs folder for a task; on
# PYTHONPATH a DAG file named like a package (cuda.py) would shadow it (torch imports
# cuda) before any of our code ran
CODE_PATH = "DAGTRAIN_CODE_PATH"

# the job's status folder, where every rank keeps its status record (rank<N>.json)
STATUS_DIR = "DAGTRAIN_STATUS_DIR"

# the launcher's name for this job, written into every record: a launcher reads only
# its own job's records from a folder that earlier tries wrote into too
JOB_ID = "DAGTRAIN_JOB_ID"

# the file in the job's status folder that asks an elastic run which lost ranks to stop
# at its next epoch's end and start again on more (the launching side writes it)
REGROW = "regrow"

# what a rank prints (stderr) for people as it reaches its first collective (the
# launcher reads the record's ``ready``, not this line)
FIRST_COLLECTIVE = "reached its first collective"

# what a rank prints (stderr) for people as it starts: "dagtrain rank N runs on host
# NAME" (the launcher reads the record's ``host``)
ON_HOST = "runs on host"

# torchrun and the direct launcher, mpirun (Open MPI), horovodrun
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")

# how much of a failed rank's traceback its record keeps (the end of it)
TRACEBACK_CHARS = 6000


def env_rank() -> str | None:
    """This process's rank as its launcher set it, before any backend is initialised;
    None outside a launched job."""
    for var in RANK_VARIABLES:
        if var in os.environ:
            return os.environ[var]
    return None


def use_code_path() -> list[str]:
    """Append this process's ``CODE_PATH`` folders to ``sys.path`` (each once); return
    them."""
    folders = [f for f in os.environ.get(CODE_PATH, "").split(os.pathsep) if f]
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)
    return folders


def record_path(folder: str | Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its status record in ``folder``."""
    return Path(folder) / RANK_RECORD(rank=rank)


class StatusRecord:
    """One rank's status record: ``fields`` in memory, written whole to ``path`` (when
    there is one) by every :meth:`write`, atomically. :meth:`update` changes the fields
    in memory only (cheap enough for every step). A record once ``failed`` stays so (a
    collective's watchdog thread may report the failure while the rank's own thread
    still writes its figures). Every field is one of
    :class:`~dagtrain.records.status.RankRecord`'s: another is a bug, refused."""

    def __init__(self, path: Path | None, **fields: Any) -> None:
        self.path = path
        self.fields: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._merge(fields)

    def update(self, **fields: Any) -> None:
        with self._lock:
            self._merge(fields)

    def write(self, **fields: Any) -> None:
        with self._lock:
            self._merge(fields)
            if self.path is None:
                return
            self.fields["updated"] = time.time()
            atomic_write(self.path, json.dumps(self.fields, default=str).encode())

    def _merge(self, fields: dict[str, Any]) -> None:
        unknown = fields.keys() - FIELDS
        if unknown:
            raise TypeError(f"status record: no field {sorted(unknown)} (records.status)")
        if self.fields.get("status") == "failed":
            fields.pop("status", None)
        self.fields.update(fields)


def _rank_number(rank: int | str | None) -> int | None:
    if isinstance(rank, int):
        return rank
    return int(rank) if isinstance(rank, str) and rank.isdigit() else None


def _new_record(rank: int | str | None, role: str | None) -> StatusRecord:
    """This process's record, as rank ``rank`` (default: the launcher's), in the
    launcher's ``STATUS_DIR`` (no file without one, or without a rank)."""
    number = _rank_number(env_rank() if rank is None else rank)
    folder = os.environ.get(STATUS_DIR)
    path = record_path(folder, number) if folder and number is not None else None
    return StatusRecord(
        path,
        rank=number,
        job=os.environ.get(JOB_ID),
        role=role,
        host=socket.gethostname(),
        pid=os.getpid(),
        status="starting",
        ready=False,
        step=None,
        started=time.time(),
    )


_this: StatusRecord | None = None  # this process's record, once it has one


def start_rank(role: str, rank: int | str | None = None) -> StatusRecord:
    """Begin this process's status record and write it (``status`` ``starting``): what
    the process is (``role``: ``train`` for a training rank), its rank (default: as its
    launcher set it), host and pid. Returns the record (also :func:`this_rank`)."""
    global _this
    _this = _new_record(rank, role)
    _this.write()
    return _this


def this_rank() -> StatusRecord:
    """This process's status record: the one :func:`start_rank` began, else one begun
    now without writing it."""
    global _this
    if _this is None:
        _this = _new_record(None, None)
    return _this


def mark_ready() -> None:
    """Record that this rank reached its first collective (``ready``): a rank that
    never does is named as the one the others waited for."""
    this_rank().write(ready=True)


def report_failure(rank: int | str | None, error: BaseException) -> None:
    """Write why this rank failed into its status record (atomically; no file without
    the launcher's ``STATUS_DIR``). ``fail_fast``: the error, or one it was raised from
    (a task of the step graph wraps what its body raised), is bad input or a missing
    dependency (``dagtrain.errors.FAIL_FAST``), which another try would meet again; that
    one is then the error reported. ``step`` stays what the rank last recorded: the
    steps it had completed. Never raises for a record it cannot write (the caller is
    on its way out: a collective's watchdog must still end the process)."""
    record = this_rank()
    number = _rank_number(rank)
    if record.fields.get("rank") is None and number is not None:
        folder = os.environ.get(STATUS_DIR)
        record.fields["rank"] = number
        record.path = record_path(folder, number) if folder else None
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, FAIL_FAST):
        cause = cause.__cause__
    shown = cause or error
    try:
        record.write(
            status="failed",
            type=type(shown).__name__,
            message=str(shown),
            fail_fast=cause is not None,
            time=time.time(),
            traceback="".join(traceback.format_exception(error))[-TRACEBACK_CHARS:],
        )
    except OSError as e:  # the rank is failing anyway: its exit status still tells
        print(f"dagtrain: cannot write the status record {record.path}: {e}", file=sys.stderr)


_stop_hooks: list[Callable[[str], None]] = []
_stop_lock = threading.Lock()


def on_stop(hook: Callable[[str], None]) -> None:
    """Have ``hook(why)`` run once when this rank is made to stop (:func:`stopping`):
    an elastic rank saves its last completed step there."""
    _stop_hooks.append(hook)


def stopping(why: str) -> None:
    """Run the hooks :func:`on_stop` registered, each once, from whatever thread is
    ending the process (a collective's watchdog, the launcher's SIGTERM, the rank's
    own error path); the first caller runs them and the others wait for it. A hook
    that raises is reported on stderr: the process is ending anyway."""
    with _stop_lock:
        hooks = list(_stop_hooks)
        _stop_hooks.clear()
        if hooks and _this is not None and "stopping" not in _this.fields:
            # first, what tells the launcher this rank survived: it was made to stop
            with contextlib.suppress(OSError):
                _this.write(stopping=why, stopping_at=time.time())
        for hook in hooks:
            try:
                hook(why)
            except BaseException as e:  # reported: the rank is ending anyway
                print(f"dagtrain: a stop hook failed: {type(e).__name__}: {e}", file=sys.stderr)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies, however it
    dies (Linux's ``PR_SET_PDEATHSIG``): a rank, or a launcher such as mpirun, never
    outlives the process that started it."""
    parent_death_signal(sig)()


def parent_death_signal(sig: int) -> Callable[[], None]:
    """A function that sets ``sig`` as this process's parent-death signal, resolved
    now: called between fork and exec (``preexec_fn``) it only makes the system call,
    no library loading that a lock held by another thread could block."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, int(sig), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
