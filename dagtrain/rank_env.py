"""Which rank this process is, as its launcher said in the environment, and why it
failed, as data for the launcher.

The one module both ``dagtrain.launch`` (which sets these variables and reads the
failures) and the ranks (which read them before any backend is initialised) import.
Standard library only, and the project's base modules.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagtrain.atomic import atomic_write
from dagtrain.errors import FAIL_FAST

__all__ = [
    "CODE_PATH",
    "ERROR_DIR",
    "FIRST_COLLECTIVE",
    "ON_HOST",
    "RANK_VARIABLES",
    "die_with_parent",
    "env_rank",
    "parent_death_signal",
    "read_failures",
    "report_failure",
    "use_code_path",
]

# folders a DAG author's modules live in (the DAG file's, the config's, Airflow's plugins
# folder), for the ranks: appended to sys.path once the rank's own imports are done,
# after the installed packages, as Airflow appends its DAGs folder for a task; on
# PYTHONPATH a DAG file named like a package (cuda.py) would shadow it (torch imports
# cuda) before any of our code ran
CODE_PATH = "DAGTRAIN_CODE_PATH"

# the folder where a rank that fails writes why, as data (``rank<N>.json``: its error's
# type and message, when, and whether another try would fail the same way), for the
# launcher to read: torchrun's error files, in dagtrain's own words
ERROR_DIR = "DAGTRAIN_ERROR_DIR"

# what a rank prints (stderr) as it reaches its first collective: the launcher names a
# rank that never printed it as the one the others waited for
FIRST_COLLECTIVE = "reached its first collective"

# what a rank prints (stderr) as it starts: "dagtrain rank N runs on host NAME"; the
# launcher learns from it where each rank runs, to name the host of a failed rank
ON_HOST = "runs on host"

# torchrun and the direct launcher, mpirun (Open MPI), horovodrun
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")


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


def report_failure(rank: str, error: BaseException) -> None:
    """Write why this rank failed into the launcher's ``ERROR_DIR`` (atomically; nothing
    without one). ``fail_fast``: the error, or one it was raised from (a task of the
    step graph wraps what its body raised), is bad input or a missing dependency
    (``dagtrain.errors.FAIL_FAST``), which another try would meet again; that one is
    then the error reported."""
    folder = os.environ.get(ERROR_DIR)
    if not folder:
        return
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, FAIL_FAST):
        cause = cause.__cause__
    shown = cause or error
    record = {
        "rank": int(rank) if rank.isdigit() else None,
        "type": type(shown).__name__,
        "message": str(shown),
        "time": time.time(),
        "fail_fast": cause is not None,
        "traceback": "".join(traceback.format_exception(error))[-6000:],
    }
    atomic_write(Path(folder) / f"rank{rank}.json", json.dumps(record).encode())


def read_failures(folder: str | Path | None) -> list[dict[str, Any]]:
    """The failures ranks reported in ``folder``, the earliest first."""
    if folder is None:
        return []
    found = []
    for path in Path(folder).glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            found.append(record)
    return sorted(found, key=lambda r: float(r.get("time") or 0))


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
