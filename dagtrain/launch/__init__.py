"""dagtrain.launch: start N ranks (mpirun, horovodrun --gloo, torchrun, or directly),
watch them, and fail fast with RankFailure naming the first rank that failed.

``run_training(config, nprocs)`` is the whole thing for a TrainConfig: it writes the
config, launches ``dagtrain.training.rank`` on every rank and returns rank 0's
TrainResult. Importing this package imports neither torch nor MPI.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .launcher import (
    DEFAULT_LAUNCHER,
    LAUNCHERS,
    Job,
    RankFailure,
    build_argv,
    env_rank,
    launch,
)

if TYPE_CHECKING:
    from dagtrain.training import TrainConfig, TrainResult

__all__ = ["LAUNCHERS", "Job", "RankFailure", "build_argv", "env_rank", "launch", "run_training"]


def run_training(
    cfg: TrainConfig,
    nprocs: int = 2,
    launcher: str | None = None,
    hosts: Sequence[str] | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Job], None] | None = None,
) -> TrainResult:
    """Train with ``nprocs`` ranks of ``cfg.backend``; return rank 0's TrainResult.

    ``launcher`` defaults to mpirun for the mpi and horovod backends and to direct
    spawning for torch and local. Raises RankFailure if a rank fails.
    """
    from dagtrain.training import TrainResult

    launcher = launcher or DEFAULT_LAUNCHER[cfg.backend]
    with tempfile.TemporaryDirectory(prefix="dagtrain-run-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        out = Path(tmp) / "result.json"
        cfg_path.write_text(cfg.model_dump_json())
        launch(
            ["dagtrain.training.rank", str(cfg_path), str(out)],
            nprocs,
            launcher,
            hosts,
            timeout=timeout,
            on_line=on_line,
            on_start=on_start,
        )
        if not out.exists():
            raise RankFailure(0, 0, None, [], " without writing its result")
        return TrainResult.from_json(out.read_text())
