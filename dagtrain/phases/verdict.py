"""Champion / challenger: whether a model is promoted, decided exactly, said truly.

The metric and its direction are the objective's (``evaluation.metric``, ``mode``).
Accuracy is a fraction of integer counts (``test_correct`` of ``test_units``, the
samples or tokens), and is compared as that fraction: 27 right of 30 is 9/10, so it
meets ``threshold: 0.9``.
The config's thresholds are compared as the decimals they were written as
(``Fraction("0.9")``), a loss as the exact value of its float. A verdict's message shows
each number with as many digits as the decision needs (four at least), so what it says
never contradicts what was decided: a challenger shown as ``0.9694`` that beat a
champion's ``0.9694`` is shown with the digits where they differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError
from dagtrain.records.registry import RegistryEntry

__all__ = ["better", "direction", "exact", "metric_of", "shown"]

_MIN_DIGITS, _MAX_DIGITS = 4, 17


def exact(metrics: dict[str, Any], name: str) -> Fraction:
    """Metric ``name`` of ``metrics`` as an exact number: an accuracy as the fraction of
    its counts (``<split>_correct`` / ``<split>_samples``; a record written before counts
    were kept: its float as the nearest fraction with that denominator), anything else
    as its float's exact value."""
    value = metrics[name]
    split, _, kind = name.partition("_")
    if kind == "accuracy":  # of samples (classification) or of tokens (units)
        correct = metrics.get(f"{split}_correct")
        samples = metrics.get(f"{split}_units", metrics.get(f"{split}_samples"))
        if isinstance(correct, int) and isinstance(samples, int) and samples > 0:
            return Fraction(correct, samples)
        if isinstance(samples, int) and samples > 0:
            return Fraction(value).limit_denominator(samples)
    return Fraction(value)


def _decimal(value: float) -> Fraction:
    """A threshold of the config as the decimal it was written as."""
    return Fraction(repr(float(value)))


def shown(values: Sequence[Fraction], holds: Callable[[Sequence[Fraction]], bool]) -> list[str]:
    """``values`` printed with the fewest digits (at least four) at which ``holds``,
    applied to the numbers as printed, gives what it gives to the exact ``values``."""
    truth = holds(values)
    for digits in range(_MIN_DIGITS, _MAX_DIGITS + 1):
        text = [f"{float(v):.{digits}f}" for v in values]
        if holds([Fraction(t) for t in text]) == truth:
            return text
    return [repr(float(v)) for v in values]


def metric_of(cfg: PipelineConfig, directions: dict[str, str] | None = None) -> str:
    """The metric that decides promotion: ``evaluation.metric``, or the objective's
    first (``directions``: the objective's metrics in its order, where its code was
    imported; else the config's own rule, ``PipelineConfig.promotion_metric``)."""
    if cfg.evaluation.metric is None and directions:
        return f"test_{next(iter(directions))}"
    return cfg.promotion_metric


def direction(cfg: PipelineConfig, directions: dict[str, str] | None = None) -> str:
    """Whether the promotion metric is better higher (``max``) or lower (``min``):
    ``evaluation.mode``, or where it is ``auto`` the direction the objective declares
    (``directions``: its metrics', the author's own objective's as its code says)."""
    ev = cfg.evaluation
    if ev.mode != "auto":
        return ev.mode
    metric = metric_of(cfg, directions).removeprefix("test_")
    known = directions or cfg.objective.metrics() or {}
    return known.get(metric, "max" if metric in ("accuracy", "r2") else "min")


def better(
    cfg: PipelineConfig,
    challenger: dict[str, Any],
    champ: RegistryEntry | None,
    directions: dict[str, str] | None = None,
) -> tuple[bool, str]:
    """(promote?, why) for a challenger's metrics against the champion's registry entry:
    no worse than ``evaluation.threshold`` and better than the champion's
    ``evaluation.metric`` by more than ``evaluation.min_improvement``, in the metric's
    direction (:func:`direction`)."""
    ev, metric = cfg.evaluation, metric_of(cfg, directions)
    way = direction(cfg, directions)
    higher = way == "max"
    # the direction, said where it is not classification's as ever (accuracy up, loss
    # down, by the objective's own declaration): a classification verdict reads as it did
    said = " (higher is better)" if higher else " (lower is better)"
    if cfg.objective.name == "classification" and ev.mode == "auto":
        said = ""
    name = metric.replace("_", " ")
    if metric not in challenger:
        have = ", ".join(k for k in challenger if k.startswith("test_"))
        raise InputError(
            f"evaluation.metric {metric!r}: the evaluation did not report it (it reports "
            f"{have}); name one of those"
        )
    if not math.isfinite(float(challenger[metric])):  # a model that diverged
        return False, f"{name} is {challenger[metric]}: a diverged model is never promoted"
    mine = exact(challenger, metric)
    if ev.threshold is not None:
        bound = _decimal(ev.threshold)
        if (mine < bound) if higher else (mine > bound):
            (a,) = shown([mine], lambda v: (v[0] < bound) if higher else (v[0] > bound))
            where = "below" if higher else "above"
            return (
                False,
                f"{name} {a}{_counts(challenger, metric)} is {where} evaluation.threshold "
                f"{ev.threshold}{said}",
            )
    if champ is None:
        return True, "the first model: no champion yet"
    if metric not in champ.metrics or not math.isfinite(float(champ.metrics[metric])):
        return True, f"the champion v{champ.version} has no {name}: the challenger replaces it"
    theirs = exact(champ.metrics, metric)
    margin = _decimal(ev.min_improvement)

    def wins(v: Sequence[Fraction]) -> bool:
        gain = v[0] - v[1] if higher else v[1] - v[0]
        return gain > margin

    a, b = shown([mine, theirs], wins)
    who = f"the champion v{champ.version}'s {b}"
    if wins([mine, theirs]):
        by = f" by more than {ev.min_improvement}" if margin else ""
        return True, f"{name} {a} beats {who}{by}{said}"
    return False, f"{name} {a} does not beat {who} by more than {ev.min_improvement}{said}"


def _counts(metrics: dict[str, Any], metric: str) -> str:
    """``" (27/30)"``: an accuracy's counts, shown beside it."""
    if not metric.endswith("_accuracy"):
        return ""
    split = metric.partition("_")[0]
    correct = metrics.get(f"{split}_correct")
    units = metrics.get(f"{split}_units", metrics.get(f"{split}_samples"))
    return f" ({correct}/{units})" if isinstance(correct, int) and units else ""
