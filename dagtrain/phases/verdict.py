"""Champion / challenger: whether a model is promoted, decided exactly, said truly.

Accuracy is a fraction of integer counts (``test_correct`` of ``test_samples``), and is
compared as that fraction: 27 right of 30 is 9/10, so it meets ``min_accuracy: 0.9``.
The config's thresholds are compared as the decimals they were written as
(``Fraction("0.9")``), a loss as the exact value of its float. A verdict's message shows
each number with as many digits as the decision needs (four at least), so what it says
never contradicts what was decided: a challenger shown as ``0.9694`` that beat a
champion's ``0.9694`` is shown with the digits where they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from dagtrain.config import PipelineConfig
from dagtrain.records.registry import RegistryEntry

__all__ = ["better", "exact", "shown"]

_MIN_DIGITS, _MAX_DIGITS = 4, 17


def exact(metrics: dict[str, Any], name: str) -> Fraction:
    """Metric ``name`` of ``metrics`` as an exact number: an accuracy as the fraction of
    its counts (``<split>_correct`` / ``<split>_samples``; a record written before counts
    were kept: its float as the nearest fraction with that denominator), anything else
    as its float's exact value."""
    value = metrics[name]
    split, _, kind = name.partition("_")
    if kind == "accuracy":
        correct, samples = metrics.get(f"{split}_correct"), metrics.get(f"{split}_samples")
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


def better(
    cfg: PipelineConfig, challenger: dict[str, Any], champ: RegistryEntry | None
) -> tuple[bool, str]:
    """(promote?, why) for a challenger's metrics against the champion's registry entry:
    at least ``evaluation.min_accuracy``, and better than the champion's
    ``evaluation.metric`` by more than ``evaluation.min_improvement``."""
    ev = cfg.evaluation
    acc = exact(challenger, "test_accuracy") if "test_accuracy" in challenger else Fraction(0)
    floor = _decimal(ev.min_accuracy)
    if acc < floor:
        (a,) = shown([acc], lambda v: v[0] < floor)
        counts = _counts(challenger)
        return (
            False,
            f"test accuracy {a}{counts} is below evaluation.min_accuracy {ev.min_accuracy}",
        )
    if champ is None:
        return True, "the first model: no champion yet"
    mine, theirs = exact(challenger, ev.metric), exact(champ.metrics, ev.metric)
    margin = _decimal(ev.min_improvement)

    def wins(v: Sequence[Fraction]) -> bool:
        gain = v[0] - v[1] if ev.metric == "test_accuracy" else v[1] - v[0]
        return gain > margin

    a, b = shown([mine, theirs], wins)
    name = ev.metric.replace("_", " ")
    who = f"the champion v{champ.version}'s {b}"
    if wins([mine, theirs]):
        by = f" by more than {ev.min_improvement}" if margin else ""
        return True, f"{name} {a} beats {who}{by}"
    return False, f"{name} {a} does not beat {who} by more than {ev.min_improvement}"


def _counts(metrics: dict[str, Any]) -> str:
    correct, samples = metrics.get("test_correct"), metrics.get("test_samples")
    return f" ({correct}/{samples})" if isinstance(correct, int) and samples else ""
