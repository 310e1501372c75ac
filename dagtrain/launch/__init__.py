"""dagtrain.launch: start N ranks (mpirun, horovodrun --gloo, torchrun, or directly),
watch them, and fail fast with RankFailure naming the first rank that failed (and its
host, for ranks on several hosts: ``Hosts``, ``from_extra``).

It runs any ``python -m MODULE ARGS`` on every rank and knows nothing of training:
``dagtrain.training.run_training`` is what launches a training run. Importing this
package imports neither torch nor MPI.

Its rooms: ``argv`` (each launcher's command line), ``supervise`` (the processes: start,
watch, stop), ``diagnose`` (which rank failed and how, from the ranks' status records
and the launchers' exit statuses), ``launcher`` (``launch()``, which uses all three),
``hosts`` (host lists) and ``remote`` (the far end of a torchrun node on another host).
"""

from __future__ import annotations

from .argv import LAUNCHERS, build_argv, node_argvs
from .diagnose import RankFailure, RankInputError
from .hosts import Hosts, answers, from_extra
from .launcher import launch
from .supervise import Job

__all__ = [
    "LAUNCHERS",
    "Hosts",
    "Job",
    "RankFailure",
    "RankInputError",
    "answers",
    "build_argv",
    "from_extra",
    "launch",
    "node_argvs",
]
