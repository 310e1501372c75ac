"""Which rank this process is, as its launcher said in the environment.

The one module both ``dagtrain.launch`` (which sets these variables) and the ranks
(which read them before any backend is initialised) import. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

__all__ = [
    "FIRST_COLLECTIVE",
    "ON_HOST",
    "RANK_VARIABLES",
    "die_with_parent",
    "env_rank",
    "parent_death_signal",
]

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
