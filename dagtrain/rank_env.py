"""Which rank this process is, as its launcher said in the environment.

The one module both ``dagtrain.launch`` (which sets these variables) and the ranks
(which read them before any backend is initialised) import. Standard library only.
"""

from __future__ import annotations

import os

__all__ = ["RANK_VARIABLES", "env_rank"]

# torchrun and the direct launcher, mpirun (Open MPI), horovodrun
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")


def env_rank() -> str | None:
    """This process's rank as its launcher set it, before any backend is initialised;
    None outside a launched job."""
    for var in RANK_VARIABLES:
        if var in os.environ:
            return os.environ[var]
    return None
