"""TrainConfig: everything one training run needs, validated with clear errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["TrainConfig"]


class TrainConfig(BaseModel):
    """One data-parallel training run. Every rank gets the same config.

    ``batch_size`` is the *global* batch: each step, the ranks split it evenly, so a
    run on N ranks sees the same samples per step as one process does.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "mlp", description="built-in (mlp, cnn, rescnn, transformer) or 'package.module:factory'"
    )
    model_args: dict[str, Any] = Field(default_factory=dict)
    data: str = Field(
        "digits",
        description="'digits' (scikit-learn's, no download) or a path to .npz/.npy/.csv/.parquet",
    )
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    eval_data: str | None = Field(
        None,
        description="a separate file to evaluate on each epoch (then test_fraction is 0: "
        "'data' is all training data, as a data-prep stage writes it)",
    )
    normalize: bool = True
    init_from: str | None = Field(
        None,
        description="a checkpoint whose 'model' state starts the run (ignored when the run "
        "resumes from its own checkpoint_dir): round-based training's global model",
    )
    epochs: int = Field(5, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps")
    batch_size: int = Field(64, ge=1, description="global batch, split over the ranks")
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = 0
    backend: Literal["local", "torch", "mpi", "horovod"] = "local"
    bucket_mb: float = Field(25.0, gt=0, description="gradient bucket size (DDP's default)")
    overlap: bool = Field(True, description="false: backward, then sync all, then step")
    workers: int = Field(2, ge=1, description="executor threads per rank")
    intra_op_threads: int = Field(1, ge=1, description="torch threads per rank")
    nonfinite: Literal["fail", "skip"] = "fail"
    collective_timeout: float = Field(60.0, gt=0, description="seconds for any collective")
    checkpoint_dir: str | None = None
    checkpoint_every: int = Field(
        0, ge=0, description="steps between checkpoints; 0: at the end of each epoch"
    )
    keep_checkpoints: int = Field(3, ge=1)
    trace_dir: str | None = Field(None, description="write the last step's trace here")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        from .models import MODELS  # light: no torch work at import of this module

        if v not in MODELS and ":" not in v:
            raise ValueError(
                f"{v!r} is neither a built-in ({', '.join(MODELS)}) nor 'package.module:factory'"
            )
        return v
