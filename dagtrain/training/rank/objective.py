"""What a model is trained to do: the loss of its output on a batch's target, the metrics
reported, and which way each is better.

Everything is reduced as sums and counts: a batch gives the sum of its loss over its
*units* (samples, or a target's elements: tokens, values), the number of units, and
the sums of its *tallies* (correct predictions, absolute errors, ...). Microbatches,
ranks, evaluation batches and elastic worlds add those up, and the metrics are computed
once from the totals (:meth:`Objective.compute`), so any split of the same samples gives
the same figures, and a resumed run the uninterrupted one's.

A DAG author's own objective is ``objective.name: "package.module:factory"``: the
factory gets ``objective.args`` and returns an :class:`Objective` (a subclass, or any
object with the same attributes and methods)::

    from dagtrain.training.rank.objective import Objective

    class Huber(Objective):
        metrics = {"loss": "min", "within_10": "max"}
        tallies = ("close",)  # named apart from the metrics

        def loss(self, output, target):
            return torch.nn.functional.huber_loss(
                output.reshape(target.shape), target, reduction="sum"
            )

        def tally(self, output, target):
            close = (output.reshape(target.shape) - target).abs() < 10
            return [float(close.sum())]

        def compute(self, sums):
            return {"loss": sums["loss"] / sums["units"],
                    "within_10": sums["close"] / sums["units"]}

    def huber(**args):
        return Huber()
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from dagtrain.config import ObjectiveConfig
from dagtrain.errors import InputError

from .factories import import_factory

__all__ = [
    "Classification",
    "LanguageModel",
    "Objective",
    "Regression",
    "objective_of",
]


class Objective:
    """The base of every objective. ``metrics``: the metrics it reports (the first
    decides promotion unless ``evaluation.metric`` says otherwise), each ``"max"``
    (higher is better) or ``"min"``; ``tallies``: the names of what :meth:`tally` sums
    besides the loss and the units (named apart from the metrics: evaluation records
    both, ``test_<name>``)."""

    name = "objective"
    metrics: ClassVar[dict[str, str]] = {"loss": "min"}
    tallies: tuple[str, ...] = ()

    def loss(self, output: torch.Tensor, target: Any) -> torch.Tensor:
        """The loss of ``output`` on ``target`` summed over the batch's units: a scalar
        tensor the backward starts from."""
        raise NotImplementedError

    def units(self, target: Any) -> int:
        """How many units the loss sums over: the samples, unless overridden. Must be
        the same for every sample (the training loss is divided by the global batch's
        units before anyone has counted them all)."""
        return len(target)

    def tally(self, output: torch.Tensor, target: Any) -> list[float]:
        """The batch's sums of ``tallies``, in their order (no gradient needed)."""
        return []

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        """The metrics from the totals: ``loss`` (the summed loss), ``units`` and each
        tally."""
        return {"loss": sums["loss"] / max(sums["units"], 1)}

    # ------------------------------------------------------------------ dagtrain's side
    @property
    def sum_names(self) -> tuple[str, ...]:
        """The running sums' names, in the order a step returns them."""
        return ("loss", *self.tallies, "units")

    def figures(self, sums: Sequence[float], prefix: str) -> dict[str, float]:
        """``compute`` of the running sums, each metric named ``<prefix>_<metric>``."""
        named = dict(zip(self.sum_names, (float(v) for v in sums)))
        return {f"{prefix}_{k}": v for k, v in self.compute(named).items()}


def correct(output: torch.Tensor, target: torch.Tensor, dim: int) -> int:
    """How many of ``target`` are the class of ``output``'s highest score along ``dim``
    (``argmax``'s answer: the first of tied scores, a NaN the highest). ``max``'s
    indices are the same and cheaper on CPU, one thread: 1.3-1.7x less time over a
    256-byte vocabulary (16 x 64 tokens), 6x over 10 classes of 32 x 32 values."""
    return int((output.max(dim=dim).indices == target).sum())


class Classification(Objective):
    """Cross-entropy over classes; loss and accuracy (of the samples)."""

    name = "classification"
    metrics: ClassVar[dict[str, str]] = {"accuracy": "max", "loss": "min"}
    tallies = ("correct",)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, reduction="sum")

    def tally(self, output: torch.Tensor, target: torch.Tensor) -> list[float]:
        return [correct(output, target, 1)]

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["units"], 1)
        return {"loss": sums["loss"] / n, "accuracy": sums["correct"] / n}


class Regression(Objective):
    """Squared error of every target value; loss (= mse), mse, mae and R² (of all the
    values, against their mean)."""

    name = "regression"
    metrics: ClassVar[dict[str, str]] = {"mse": "min", "mae": "min", "r2": "max", "loss": "min"}
    tallies = ("abs_error", "target_sum", "target_squares")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output.reshape(target.shape), target.to(output.dtype), reduction="sum")

    def units(self, target: torch.Tensor) -> int:
        return target.numel()

    def tally(self, output: torch.Tensor, target: torch.Tensor) -> list[float]:
        t = target.to(torch.float64)
        err = (output.detach().reshape(target.shape).to(torch.float64) - t).abs().sum()
        return [float(err), float(t.sum()), float((t * t).sum())]

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["units"], 1)
        mse = sums["loss"] / n
        spread = sums["target_squares"] - sums["target_sum"] ** 2 / n
        r2 = 1.0 - sums["loss"] / spread if spread > 0 else 0.0
        return {"loss": mse, "mse": mse, "mae": sums["abs_error"] / n, "r2": r2}


class LanguageModel(Objective):
    """Next-token cross-entropy over the vocabulary; loss (mean per token), perplexity
    and the accuracy of the tokens."""

    name = "language_model"
    metrics: ClassVar[dict[str, str]] = {"perplexity": "min", "accuracy": "max", "loss": "min"}
    tallies = ("correct",)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="sum"
        )

    def units(self, target: torch.Tensor) -> int:
        return target.numel()

    def tally(self, output: torch.Tensor, target: torch.Tensor) -> list[float]:
        return [correct(output, target, -1)]

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["units"], 1)
        loss = sums["loss"] / n
        # exp of a mean cross-entropy; past e^700 it is infinite, which says as much
        perplexity = math.exp(loss) if loss < 700 else math.inf
        return {"loss": loss, "perplexity": perplexity, "accuracy": sums["correct"] / n}


BUILTINS: dict[str, type[Objective]] = {
    c.name: c for c in (Classification, Regression, LanguageModel)
}


def objective_of(spec: ObjectiveConfig) -> Objective:
    """The objective ``spec`` names: a built-in, or the author's factory called with
    ``objective.args``; InputError naming ``objective.name`` when it cannot be imported
    or returns something that is not an objective."""
    if spec.name in BUILTINS:
        if spec.args:
            raise InputError(
                f"objective.args {spec.args}: the built-in objective {spec.name!r} takes "
                "no arguments; leave objective.args out"
            )
        return BUILTINS[spec.name]()
    factory = import_factory(spec.name, "objective.name")
    try:
        made = factory(**spec.args)
    except (TypeError, ValueError) as e:
        raise InputError(
            f"objective.args {spec.args}: the objective {spec.name!r} refused them: {e}"
        ) from e
    if not isinstance(made, Objective):
        raise InputError(
            f"objective.name {spec.name!r}: the factory returned a {type(made).__name__}, "
            "not an objective: return an instance of a subclass of "
            "dagtrain.training.rank.objective.Objective"
        )
    metrics = getattr(made, "metrics", None)
    if (
        not isinstance(metrics, dict)
        or "loss" not in metrics
        or any(v not in ("max", "min") for v in metrics.values())
    ):
        raise InputError(
            f"objective.name {spec.name!r}: its metrics {metrics!r} must be a dict of "
            "metric names to 'max' or 'min', 'loss' among them"
        )
    return made


def checked_loss(objective: Objective, output: torch.Tensor, target: Any, spec: str) -> None:
    """Refuse (InputError naming ``objective.name``) an objective whose loss on a first
    batch is not a finite-typed scalar tensor with a gradient, or whose metrics are not
    all computed: checked before training starts."""
    loss = objective.loss(output, target)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise InputError(
            f"objective.name {spec!r}: its loss of a batch is {shape}, not a scalar tensor: "
            "return the sum of the loss over the batch (reduction='sum')"
        )
    if not loss.is_floating_point():
        raise InputError(f"objective.name {spec!r}: its loss is of dtype {loss.dtype}, not float")
    tallied = list(objective.tally(output.detach(), target))
    if len(tallied) != len(objective.tallies):
        raise InputError(
            f"objective.name {spec!r}: tally() gave {len(tallied)} value(s) for tallies "
            f"{tuple(objective.tallies)}"
        )
    sums = dict(zip(objective.tallies, tallied)) | {"loss": float(loss.detach()), "units": 1.0}
    got = objective.compute(sums)
    absent = [m for m in objective.metrics if m not in got]
    if absent:
        raise InputError(
            f"objective.name {spec!r}: compute() does not give {', '.join(absent)}, which "
            "its metrics declare"
        )
