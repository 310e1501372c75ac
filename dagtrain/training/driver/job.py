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

from dagtrain.changes import change_line
from dagtrain.config import TrainConfig
from dagtrain.errors import InputError
from dagtrain.launch import Hosts, Job, RankFailure, launch
from dagtrain.records import metrics
from dagtrain.records.layout import TrainFiles
from dagtrain.records.result import TrainResult
from dagtrain.sync import require

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
    on_change: Callable[[dict], None] | None = None,
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

    An elastic run (``distributed.min_ranks`` < ``ranks``) goes on after a lost rank or
    host on the ranks left (:mod:`.elastic`); ``on_change`` gets each world change as a
    dict, which is also appended to ``metrics_file`` (``kind`` ``world``) and told to
    ``on_line`` as one line (``dagtrain: world 3 -> 2 ranks at step ...``), and the
    result's ``world_changes`` lists them.
    """
    if nprocs is not None and nprocs != cfg.distributed.ranks:
        data = cfg.model_dump()
        data["distributed"]["ranks"] = nprocs
        cfg = TrainConfig.model_validate(data)
    require(cfg.distributed.backend)
    d = cfg.distributed
    if d.elastic and not cfg.checkpoint_dir:
        raise InputError(
            f"distributed.min_ranks {d.min_ranks}: an elastic run's survivors save their "
            "last step into checkpoint_dir, and none is set; set checkpoint_dir (a "
            "pipeline's training task always has one)"
        )
    spec = Hosts.of(hosts or d.hosts or None)
    # torch.set_num_threads holds for the thread that calls it: the step graph's worker
    # threads would run their kernels on OpenMP's default team (every core), and a run
    # of 3 ranks came out different, bit for bit, from one run to the next
    ranks_env = {**(env or {}), "OMP_NUM_THREADS": str(cfg.executor.intra_op_threads)}
    with tempfile.TemporaryDirectory(prefix="dagtrain-run-", dir=work_dir) as tmp:
        # the status records: where the training page reads them, else beside the
        # exchanged files (on storage every host shares when work_dir is)
        exchanged = TrainFiles(Path(tmp))  # the files the ranks read and write, as a task's
        status_dir = Path(cfg.status_dir or exchanged.ranks)

        def launch_world(
            run_cfg: TrainConfig, world: Hosts | None, started: Callable[[Job], None]
        ) -> TrainResult:
            cfg_path, out = exchanged.config, exchanged.result
            out.unlink(missing_ok=True)
            cfg_path.write_text(run_cfg.model_dump_json())

            jobs: list[Job] = []

            def begun(job: Job) -> None:
                jobs.append(job)
                started(job)
                if on_start is not None:
                    on_start(job)

            try:
                launch(
                    ["dagtrain.training.rank", str(cfg_path), str(out)],
                    run_cfg.world or d.ranks,
                    launcher or d.resolved_launcher,
                    world,
                    env=ranks_env,
                    timeout=timeout,
                    on_line=on_line,
                    on_start=begun,
                    status_dir=status_dir,
                )
            except RankFailure as e:
                # lost after every rank had finished its work and rank 0 had written the
                # result (in its teardown): the run is done, nothing to train again
                if not (jobs and jobs[-1].done() and out.exists()):
                    raise
                if on_line is not None:
                    on_line(f"dagtrain: {e.summary}, after every rank had finished: done")
            if not out.exists():
                raise RankFailure(0, 0, None, [], " without writing its result")
            return TrainResult.from_json(out.read_text())

        if not d.elastic:
            return launch_world(cfg, spec, lambda job: None)
        from .elastic import run_elastic

        def changed(change: dict) -> None:
            if cfg.metrics_file:
                metrics.append(cfg.metrics_file, change)
            if on_line is not None:  # the task's log: the line the CLI shows too
                on_line(f"dagtrain: {change_line(change)}")
            if on_change is not None:
                on_change(change)

        return run_elastic(cfg, spec, launch_world, status_dir, changed, on_line)
