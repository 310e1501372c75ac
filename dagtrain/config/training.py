"""The ``training`` section: the optimisation every rank runs and its recipe (the LR
schedule, clipping, precision, accumulation, early stopping, the initial weights),
checkpoints, and the training task's retries. Pydantic only: no torch."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from dagtrain.errors import InputError

from .section import SEED_MAX, Section

__all__ = ["INIT_KINDS", "EarlyStoppingConfig", "TrainingConfig"]


class EarlyStoppingConfig(Section):
    """Stop when a validation metric has not improved for ``patience`` epochs."""

    metric: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="a metric the objective reports (loss, accuracy, mse, perplexity, ...), "
        "watched on the validation split each epoch; default: the objective's first, the "
        "one promotion compares. Which way is better comes from the objective",
    )
    patience: int = Field(
        3, ge=1, le=1_000_000, description="epochs without improvement before stopping"
    )
    min_delta: float = Field(
        0.0, ge=0, le=1e12, description="an improvement smaller than this does not count"
    )


# training.init values that are not a file
INIT_KINDS = ("scratch", "champion")


class TrainingConfig(Section):
    """The optimisation every rank runs, checkpoints, and the training task's retries."""

    epochs: int = Field(5, ge=1, le=1_000_000, description="passes over the training data")
    max_steps: int | None = Field(None, ge=1, le=10**12, description="stop after this many steps")
    batch_size: int = Field(
        64, ge=1, le=10_000_000, description="global batch, split over the ranks"
    )
    optimizer: Literal["sgd", "adam", "adamw"] = Field("sgd", description="sgd, adam or adamw")
    lr: float = Field(0.05, gt=0, le=1e3, description="learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (sgd only)")
    weight_decay: float = Field(0.0, ge=0, le=1e3, description="L2 penalty (decoupled: adamw)")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="after the warmup: constant, or linear/cosine decay to lr x min_lr_ratio "
        "at the run's last step",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        le=10**12,
        description="steps whose LR rises linearly to lr (not with warmup_ratio)",
    )
    warmup_ratio: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="warmup as a fraction of the run's steps (not with warmup_steps)",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="the decayed LR at the last step, as a fraction of lr"
    )
    max_grad_norm: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="clip the whole model's averaged gradient to this global L2 norm "
        "(across ranks and pipeline stages); unset: no clipping",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="bf16: autocast forward and backward, fp32 weights and optimizer state "
        "(CPU and CUDA); fp16: the same with a gradient scaler, CUDA only",
    )
    accumulation_steps: int = Field(
        1,
        ge=1,
        le=4096,
        description="each rank's share of a step in this many chunks, one update after the "
        "last; batch_size stays the global batch of one update (not with a pipeline)",
    )
    early_stopping: EarlyStoppingConfig | None = Field(
        None,
        description="stop when the validation metric stops improving; the best epoch's "
        "model is kept, evaluated and promoted",
    )
    init: str = Field(
        "scratch",
        min_length=1,
        description="the initial weights: scratch, champion (the registry's current "
        "champion of this pipeline), or a model file (config files only)",
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="model init, data order, dropout")
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="non-finite gradients: fail, or skip the step on every rank"
    )
    checkpoint_every: int = Field(
        0, ge=0, le=10**12, description="steps; 0: at the end of each epoch"
    )
    keep_checkpoints: int = Field(3, ge=1, le=10_000, description="newest checkpoints kept")
    checkpoint_write: Literal["background", "inline"] = Field(
        "background",
        description="background: a checkpoint's state is copied and written while training "
        "goes on (each writing rank holds a copy of its parameters and optimizer state "
        "until the write ends); inline: written from the live state while the rank waits "
        "(no copy, for a model whose copy does not fit; each write must end within "
        "distributed.collective_timeout, which the other ranks wait for)",
    )
    retries: int = Field(
        2, ge=0, le=100, description="Airflow retries of each task (a retry resumes training)"
    )
    retry_delay_seconds: float = Field(
        10.0, ge=0, le=7 * 86400, description="Airflow's retry_delay of each task"
    )
    timeout_minutes: float | None = Field(
        None,
        gt=0,
        le=366 * 24 * 60,
        description="execution_timeout of a training task: its ranks are killed",
    )

    @model_validator(mode="after")
    def _recipe(self) -> TrainingConfig:
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError(
                f"training.warmup_steps {self.warmup_steps} and training.warmup_ratio "
                f"{self.warmup_ratio}: give one of them"
            )
        if self.max_steps is not None and self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"training.warmup_steps {self.warmup_steps} is not shorter than the run "
                f"(training.max_steps {self.max_steps}): warm up for fewer steps"
            )
        return self

    def warmup(self, total: int) -> int:
        """The warmup's steps in a run of ``total`` steps."""
        return self.warmup_steps or int(self.warmup_ratio * total)

    def steps(self, samples: int) -> int:
        """The run's optimizer steps on ``samples`` training samples: its epochs', or
        ``max_steps`` if fewer (the LR schedule spans them)."""
        total = self.epochs * math.ceil(samples / self.batch_size)
        return total if self.max_steps is None else min(total, self.max_steps)

    def check_warmup(self, total: int) -> None:
        """Refuse a warmup that is not shorter than the run (``total`` steps)."""
        warm = self.warmup(total)
        if warm and warm >= total:
            field = "warmup_steps" if self.warmup_steps else "warmup_ratio"
            raise InputError(
                f"training.{field}: the warmup ({warm} steps) is not shorter than the run "
                f"({total} steps: training.epochs {self.epochs} over the training data"
                f"{f', training.max_steps {self.max_steps}' if self.max_steps else ''}); "
                "warm up for fewer steps or train longer"
            )
