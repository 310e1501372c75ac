"""The training recipe, as functions of the global step and of the whole model's
gradient, shared by the data-parallel step and the pipeline's stages:

- :func:`lr_at`: the learning rate of optimizer step ``step`` (counted from 0) of a run
  of ``total`` steps — warmup, then constant, linear or cosine decay. A function of the
  global step alone, so a resumed run, an elastic world of another size and a pipeline
  give the LR sequence of an uninterrupted one-process run.
- :func:`clip_factor`: global-norm clipping's factor (torch's ``clip_grad_norm_``: the
  norm of the whole averaged gradient, max_norm / (norm + 1e-6) when that is < 1).
- :class:`Precision`: autocast for forward and the loss (bf16 on CPU and CUDA, fp16 on
  CUDA), and fp16's dynamic loss scale (GradScaler's rule: halve on a non-finite
  gradient and skip the step, double after ``GROWTH_INTERVAL`` good steps).
- :class:`EarlyStop`: the early-stopping decision from the closed epochs' rows alone, so
  a resumed or rescued run decides as the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dagtrain.config import TrainConfig, TrainingConfig
from dagtrain.errors import InputError

__all__ = ["EarlyStop", "GradStats", "Precision", "clip_factor", "cpu_has_bf16", "lr_at"]

log = logging.getLogger(__name__)


def lr_at(t: TrainingConfig, step: int, total: int) -> float:
    """The LR of optimizer step ``step`` (0-based) in a run of ``total`` steps."""
    warm = t.warmup(total)
    if step < warm:
        return t.lr * (step + 1) / warm
    if t.lr_schedule == "constant":
        return t.lr
    span = max(1, total - warm - 1)
    progress = min(1.0, (step - warm) / span)
    low = t.min_lr_ratio
    if t.lr_schedule == "linear":
        factor = 1.0 - (1.0 - low) * progress
    else:
        factor = low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr * factor


def clip_factor(norm: float, max_norm: float) -> float:
    """The factor the gradients are multiplied by: 1 when ``norm`` is within
    ``max_norm`` (as torch's ``clip_grad_norm_``, which clamps the same quotient)."""
    return min(1.0, max_norm / (norm + 1e-6))


@dataclass
class GradStats:
    """An epoch's gradient figures so far, the same on every rank (they are computed
    from the averaged gradient): the sum of the pre-clip norms, the steps clipped, the
    steps counted, the LR of the newest step and the sum of the clip factors."""

    norms: float = 0.0
    clipped: int = 0
    steps: int = 0
    lr: float | None = None
    factors: float = 0.0

    def add(self, norm: float | None, factor: float, lr: float | None) -> None:
        """A step's norm before clipping (None: not computed), the factor its
        gradient was multiplied by (1: not clipped) and its LR."""
        if norm is not None and math.isfinite(norm):
            self.norms += norm
            self.clipped += int(factor < 1.0)
            self.factors += factor
            self.steps += 1
        if lr is not None:
            self.lr = lr

    def row(self) -> dict[str, float]:
        """The epoch row's ``lr``, ``grad_norm`` (the mean pre-clip norm) and
        ``clip_rate`` (the fraction of steps clipped), ``clip_factor`` (the mean factor
        the gradients were multiplied by, 1 for a step not clipped); what is known."""
        out: dict[str, float] = {}
        if self.lr is not None:
            out["lr"] = self.lr
        if self.steps:
            out["grad_norm"] = self.norms / self.steps
            out["clip_rate"] = self.clipped / self.steps
            out["clip_factor"] = self.factors / self.steps
        return out

    def state(self) -> list[float | None]:
        return [self.norms, self.clipped, self.steps, self.lr, self.factors]

    @classmethod
    def of(cls, state: Sequence[Any] | None) -> GradStats:
        if not state:
            return cls()
        norms, clipped, steps, lr, factors = state
        lr = None if lr is None else float(lr)
        return cls(float(norms), int(clipped), int(steps), lr, float(factors))


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 instructions oneDNN uses (AVX512-BF16, AMX)."""
    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


# fp16's loss scale (torch.amp.GradScaler's defaults)
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000


class Precision:
    """Forward and loss under autocast in ``training.precision`` on ``device``, and
    fp16's loss scale (``scale``: 1 for fp32 and bf16)."""

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.name = cfg.training.precision
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)
        if self.name == "fp16" and device.type != "cuda":
            raise InputError(
                f"training.precision fp16 needs a CUDA device; this rank runs on {device} "
                "(distributed.device auto found no GPU): use precision bf16 on CPU"
            )
        if self.name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise InputError(
                f"training.precision bf16: this rank's GPU ({torch.cuda.get_device_name(device)}) "
                "has no bf16; use precision fp16 (with its gradient scaler) or fp32"
            )
        if self.name == "bf16" and device.type == "cpu" and not cpu_has_bf16():
            log.warning(
                "training.precision bf16 on a CPU without bf16 instructions (AVX512-BF16 or "
                "AMX; this one: %s): torch emulates them, many times slower than fp32 "
                "(9-27x on the machine of docs/benchmarks.md); fp32 is faster here",
                torch.backends.cpu.get_cpu_capability(),
            )
        self.scale = INIT_SCALE if self.name == "fp16" else 1.0
        self.good = 0  # steps since the scale last changed

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def scaled(self) -> bool:
        return self.name == "fp16"

    def update(self, finite: bool) -> None:
        """fp16: the scale after a step whose averaged gradient was (not) finite."""
        if not self.scaled:
            return
        if not finite:
            self.scale, self.good = max(self.scale * 0.5, 1.0), 0
        else:
            self.good += 1
            if self.good >= GROWTH_INTERVAL:
                self.scale, self.good = self.scale * 2.0, 0

    def state(self) -> dict[str, float]:
        return {"scale": self.scale, "good": self.good}

    def load(self, state: dict[str, Any] | None) -> None:
        if state and self.scaled:
            self.scale, self.good = float(state["scale"]), int(state["good"])


class EarlyStop:
    """``training.early_stopping`` over the closed epochs' rows: the watched value is
    ``<split>_<metric>`` of each row (rank 0's evaluation), better in the objective's
    direction for the metric by more than ``min_delta``."""

    def __init__(self, cfg: TrainConfig, metrics: dict[str, str], split: str) -> None:
        es = cfg.training.early_stopping
        self.on = es is not None
        self.metric = (es.metric if es and es.metric else next(iter(metrics))) if es else ""
        if es is not None and self.metric not in metrics:
            raise InputError(
                f"training.early_stopping.metric {self.metric!r}: objective "
                f"{cfg.objective.name!r} does not report it; it reports {', '.join(metrics)}"
            )
        self.key = f"{split}_{self.metric}"
        self.direction = metrics.get(self.metric, "min")
        self.patience = es.patience if es else 0
        self.min_delta = es.min_delta if es else 0.0

    def best(self, rows: Sequence[dict[str, Any]]) -> tuple[int | None, float | None, int]:
        """(the best epoch, its value, the epochs since it) of ``rows``."""
        best_i, best_v, since = None, None, 0
        for i, row in enumerate(rows):
            v = row.get(self.key)
            if v is None or not math.isfinite(v):
                since += 1
                continue
            gain = (
                (v - best_v if self.direction == "max" else best_v - v)
                if best_v is not None
                else None
            )
            if gain is None or gain > self.min_delta:
                best_i, best_v, since = i, v, 0
            else:
                since += 1
        return best_i, best_v, since

    def decide(self, rows: Sequence[dict[str, Any]]) -> tuple[bool, bool]:
        """(the last row is the best so far, training should stop after it)."""
        best_i, _, since = self.best(rows)
        return best_i == len(rows) - 1, since >= self.patience

    def record(self, rows: Sequence[dict[str, Any]], stopped: bool) -> dict[str, Any]:
        """The result's ``early_stop``."""
        best_i, best_v, since = self.best(rows)
        last = len(rows) - 1
        better = "higher" if self.direction == "max" else "lower"
        if stopped:
            why = (
                f"{self.key.replace('_', ' ', 1)} did not improve by more than "
                f"{self.min_delta:g} for {since} epoch(s) after epoch {(best_i or 0) + 1}"
            )
        else:
            why = "trained to the last step"
        return {
            "metric": self.key,
            "direction": self.direction,
            "better": better,
            "best_epoch": best_i,
            "best": best_v,
            "stopped_after_epoch": last if stopped else None,
            "patience": self.patience,
            "min_delta": self.min_delta,
            "why": why,
        }
