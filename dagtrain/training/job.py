"""``run_training(config)``: a training run on its ranks, through ``dagtrain.launch``.

It writes the TrainConfig the ranks receive, starts ``python -m dagtrain.training.rank``
on ``distributed.ranks`` ranks with ``distributed.launcher`` (default: mpirun for mpi and
horovod, direct for torch and local), and returns rank 0's TrainResult, whose
``config`` is the config the ranks received. Importing this module imports no torch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dagtrain.config import TrainConfig
from dagtrain.launch import Hosts, Job, RankFailure, launch
from dagtrain.sync import require

if TYPE_CHECKING:
    from .trainer import TrainResult

__all__ = ["run_training"]


def run_training(
    cfg: TrainConfig,
    nprocs: int | None = None,
    launcher: str | None = None,
    hosts: Hosts | Sequence[str] | None = None,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Job], None] | None = None,
    work_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> TrainResult:
    """Train on the ranks of ``cfg.distributed``; return rank 0's TrainResult.

    ``nprocs``, ``launcher`` and ``hosts`` default to ``distributed.ranks``,
    ``distributed.launcher`` and ``distributed.hosts`` (``hosts`` may also be a Hosts,
    with its rsh agent). ``work_dir``: where the ranks' config and rank 0's result are
    exchanged (a temporary folder in it); ranks on other hosts need it on storage they
    share (default: the system's temporary folder). ``env``: variables every rank gets
    (``dagtrain.rank_env.CODE_PATH``: folders the ranks import a model factory from).
    The ranks keep their status records (``dagtrain.rank_env``) in ``cfg.status_dir``
    when it is set, else in the temporary folder. An ``nprocs`` that differs is
    set as ``distributed.ranks`` (and validated) so that every rank receives it. Raises
    MissingDependency before anything starts if the backend is not installed,
    RankFailure if a rank fails, TimeoutError after ``timeout`` seconds.
    """
    from .trainer import TrainResult

    if nprocs is not None and nprocs != cfg.distributed.ranks:
        data = cfg.model_dump()
        data["distributed"]["ranks"] = nprocs
        cfg = TrainConfig.model_validate(data)
    require(cfg.distributed.backend)
    d = cfg.distributed
    with tempfile.TemporaryDirectory(prefix="dagtrain-run-", dir=work_dir) as tmp:
        cfg_path = Path(tmp) / "config.json"
        out = Path(tmp) / "result.json"
        cfg_path.write_text(cfg.model_dump_json())
        launch(
            ["dagtrain.training.rank", str(cfg_path), str(out)],
            d.ranks,
            launcher or d.resolved_launcher,
            hosts or d.hosts or None,
            env=env,
            timeout=timeout,
            on_line=on_line,
            on_start=on_start,
            # the status records: where the training page reads them, else beside the
            # exchanged files (on storage every host shares when work_dir is)
            status_dir=cfg.status_dir or Path(tmp) / "ranks",
        )
        if not out.exists():
            raise RankFailure(0, 0, None, [], " without writing its result")
        return TrainResult.from_json(out.read_text())
