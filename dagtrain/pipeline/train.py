"""The training stage of a pipeline: a TrainConfig from the pipeline's, the ranks
launched, the result kept beside the checkpoints.

Retries resume from the artifact directory: a task's checkpoints live under
``runs/<run>/train/checkpoints`` (a shard's under its round), a path that depends only
on the DAG run and the task, so try 2 finds what try 1 wrote, and the training layer
resumes from the newest valid checkpoint there. (Airflow 3.3's task state store would
hold a pointer; the directory already is one, and it survives the metadata DB.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagtrain.config import PipelineConfig

from .files import write_json

__all__ = ["train_config", "run_train"]


def train_config(
    cfg: PipelineConfig,
    data: str,
    eval_data: str | None,
    checkpoint_dir: Path,
    trace_dir: Path | None,
    **over: Any,
):
    from dagtrain.training import TrainConfig

    t, dist, ex = cfg.training, cfg.distributed, cfg.executor
    fields: dict[str, Any] = {
        "model": cfg.model.name,
        "model_args": cfg.model.args,
        "data": data,
        "eval_data": eval_data,
        "test_fraction": 0.0,
        "normalize": False,  # the prep stage normalised with train statistics
        "epochs": t.epochs,
        "max_steps": t.max_steps,
        "batch_size": t.batch_size,
        "optimizer": t.optimizer,
        "lr": t.lr,
        "momentum": t.momentum,
        "weight_decay": t.weight_decay,
        "seed": t.seed,
        "backend": dist.backend,
        "bucket_mb": dist.bucket_mb,
        "overlap": dist.overlap,
        "collective_timeout": dist.collective_timeout,
        "workers": ex.workers,
        "intra_op_threads": ex.intra_op_threads,
        "nonfinite": t.nonfinite,
        "checkpoint_dir": str(checkpoint_dir),
        "checkpoint_every": t.checkpoint_every,
        "keep_checkpoints": t.keep_checkpoints,
        "trace_dir": str(trace_dir) if trace_dir and ex.trace else None,
    }
    fields.update(over)
    return TrainConfig(**fields)


def run_train(
    cfg: PipelineConfig,
    tcfg,
    out_dir: Path,
    ranks: int,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Launch the ranks; write and return a summary of rank 0's TrainResult."""
    from dataclasses import asdict

    from dagtrain.launch import run_training

    if cfg.distributed.backend == "horovod":
        from dagtrain.tools import ensure_horovod

        ensure_horovod()
    launcher = cfg.distributed.launcher
    res = run_training(
        tcfg,
        ranks,
        launcher=launcher,
        hosts=cfg.distributed.hosts or None,
        timeout=timeout,
        on_line=on_line,
        on_start=on_start,
    )
    summary = {k: v for k, v in asdict(res).items() if k not in ("step_seconds",)} | {
        "test_accuracy": res.test_accuracy,
        "median_step_seconds": sorted(res.step_seconds)[len(res.step_seconds) // 2]
        if res.step_seconds
        else None,
        "epochs_trained_now": len(res.epochs) - res.resumed_epochs,
    }
    write_json(out_dir / "result.json", summary)
    return summary
