"""The training stage of a pipeline: the ranks launched, the result kept beside the
checkpoints.

The ranks receive ``PipelineConfig.train_config(...)``: the pipeline's model, training,
distributed and executor sections as they are, and this run's files. Retries resume
from the artifact directory: a task's checkpoints live under
``runs/<run>/train/checkpoints`` (a shard's under its round), a path that depends only
on the DAG run and the task, so try 2 finds what try 1 wrote, and the training layer
resumes from the newest valid checkpoint there. (Airflow 3.3's task state store would
hold a pointer; the directory already is one, and it survives the metadata DB.)

Beside the checkpoints: ``result.json`` (rank 0's result, with ``config``, what the
ranks received), ``config.json`` (that config alone: the run's effective config) and
``metrics.jsonl`` (rank 0's progress, a line per epoch, appended by every try).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dagtrain.config import TrainConfig

from .files import write_json

__all__ = ["run_train"]


def run_train(
    tcfg: TrainConfig,
    out_dir: Path,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Launch the ranks; write and return a summary of rank 0's TrainResult."""
    from dagtrain.training import run_training

    res = run_training(tcfg, timeout=timeout, on_line=on_line, on_start=on_start)
    times = sorted(res.step_seconds)
    summary = {k: v for k, v in asdict(res).items() if k != "step_seconds"} | {
        "val_accuracy": res.val_accuracy,  # eval_data: the prepared validation split
        "median_step_seconds": times[len(times) // 2] if times else None,
        # what this try did itself: a resume mid-epoch trains the rest of that epoch, so
        # steps_trained_now > 0 with epochs_trained_now == 0 is work done, not lost
        "epochs_trained_now": len(res.epochs) - res.resumed_epochs,
        "steps_trained_now": res.steps - (res.resumed_from_step or 0),
    }
    write_json(out_dir / "config.json", res.config)
    write_json(out_dir / "result.json", summary)
    return summary
