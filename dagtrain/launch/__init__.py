"""dagtrain.launch: start N ranks (mpirun, horovodrun --gloo, torchrun, or directly),
watch them, and fail fast with RankFailure naming the first rank that failed (and its
host, for ranks on several hosts: ``Hosts``, ``from_extra``).

It runs any ``python -m MODULE ARGS`` on every rank and knows nothing of training:
``dagtrain.training.run_training`` is what launches a training run. Importing this
package imports neither torch nor MPI.
"""

from __future__ import annotations

from .hosts import Hosts, from_extra
from .launcher import (
    LAUNCHERS,
    Job,
    RankFailure,
    RankInputError,
    build_argv,
    launch,
    node_argvs,
)

__all__ = [
    "LAUNCHERS",
    "Hosts",
    "Job",
    "RankFailure",
    "RankInputError",
    "build_argv",
    "from_extra",
    "launch",
    "node_argvs",
]
