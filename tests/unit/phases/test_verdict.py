"""Champion / challenger decided exactly, and said without contradicting the numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dagtrain.config import PipelineConfig
from dagtrain.phases.registry import better
from dagtrain.phases.verdict import exact, shown
from dagtrain.records.registry import RegistryEntry


def cfg(**evaluation) -> PipelineConfig:
    return PipelineConfig.model_validate({"evaluation": evaluation})


def test_27_right_of_30_meets_a_threshold_of_0_9():
    metrics = {"test_accuracy": 27 / 30, "test_correct": 27, "test_samples": 30}
    assert better(cfg(threshold=0.9), metrics, None) == (
        True,
        "the first model: no champion yet",
    )
    # what float32 made of it before counts were kept: still 9/10 with its denominator
    old = {"test_accuracy": 0.8999999761581421, "test_samples": 30}
    assert exact(old, "test_accuracy") == Fraction(9, 10)
    assert better(cfg(threshold=0.9), old, None)[0]


def test_below_the_floor_names_the_counts_and_never_rounds_up_to_the_floor():
    ok, why = better(
        cfg(threshold=0.9),
        {"test_accuracy": 26 / 30, "test_correct": 26, "test_samples": 30},
        None,
    )
    assert not ok and why == "test accuracy 0.8667 (26/30) is below evaluation.threshold 0.9"
    ok, why = better(cfg(threshold=0.9), {"test_accuracy": 0.89999}, None)
    assert not ok and why == "test accuracy 0.89999 is below evaluation.threshold 0.9"


def test_a_verdict_names_the_champion_and_shows_the_digits_that_decide():
    champ = RegistryEntry(1, "", metrics={"test_accuracy": 0.9694})
    ok, why = better(cfg(), {"test_accuracy": 0.9694}, champ)
    assert not ok
    assert why == "test accuracy 0.9694 does not beat the champion v1's 0.9694 by more than 0.0"
    ok, why = better(cfg(), {"test_accuracy": 0.96944}, champ)
    assert ok and why == "test accuracy 0.96944 beats the champion v1's 0.96940"


@pytest.mark.parametrize(
    ("mine", "theirs", "promoted"),
    [((349, 359), (348, 359), False), ((350, 359), (348, 359), True)],
)
def test_min_improvement_is_compared_on_exact_fractions(mine, theirs, promoted):
    margin = 1 / 359  # one more right answer of 359 is not *more* than 1/359
    champ = RegistryEntry(3, "", metrics=_acc(*theirs))
    ok, why = better(cfg(min_improvement=round(margin, 6)), _acc(*mine), champ)
    assert ok is promoted, why
    assert "the champion v3's" in why


def test_lower_loss_wins_when_the_metric_is_the_loss():
    champ = RegistryEntry(2, "", metrics={"test_accuracy": 0.9, "test_loss": 0.2})
    ok, why = better(cfg(metric="test_loss"), {"test_accuracy": 0.9, "test_loss": 0.1}, champ)
    assert ok and why == "test loss 0.1000 beats the champion v2's 0.2000"


def test_shown_adds_digits_until_the_printed_numbers_decide_as_the_exact_ones():
    a, b = Fraction(969444, 10**6), Fraction(969440, 10**6)
    assert shown([a, b], lambda v: v[0] > v[1]) == ["0.969444", "0.969440"]
    assert shown([a, a], lambda v: v[0] > v[1]) == ["0.9694", "0.9694"]


def _acc(correct: int, samples: int) -> dict:
    return {"test_accuracy": correct / samples, "test_correct": correct, "test_samples": samples}


def objective_cfg(objective: str, **evaluation) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"objective": {"name": objective}, "evaluation": evaluation}
    )


def test_a_classification_verdict_reads_as_it_did_and_another_mode_says_its_direction():
    champ = RegistryEntry(1, "", metrics={"test_loss": 0.2})
    ok, why = better(cfg(metric="test_loss", mode="max"), {"test_loss": 0.3}, champ)
    assert ok and why == "test loss 0.3000 beats the champion v1's 0.2000 (higher is better)"


def test_a_language_model_is_promoted_on_lower_perplexity_by_default():
    c = objective_cfg("language_model")
    assert c.promotion_metric == "test_perplexity"
    champ = RegistryEntry(2, "", metrics={"test_perplexity": 5.48})
    ok, why = better(c, {"test_perplexity": 5.21}, champ)
    assert ok and why == "test perplexity 5.2100 beats the champion v2's 5.4800 (lower is better)"
    ok, why = better(c, {"test_perplexity": 5.5}, champ)
    assert not ok and why.endswith("by more than 0.0 (lower is better)")


def test_a_threshold_bounds_the_metric_in_its_direction_and_mode_overrides_it():
    c = objective_cfg("regression", threshold=3000.0)
    assert c.promotion_metric == "test_mse"
    ok, why = better(c, {"test_mse": 3100.0}, None)
    assert (
        not ok
        and why == "test mse 3100.0000 is above evaluation.threshold 3000.0 (lower is better)"
    )
    assert better(c, {"test_mse": 2900.0}, None) == (True, "the first model: no champion yet")
    r2 = objective_cfg("regression", metric="test_r2", threshold=0.4)
    assert not better(r2, {"test_r2": 0.3}, None)[0]
    flipped = objective_cfg("regression", metric="test_r2", mode="min")
    champ = RegistryEntry(1, "", metrics={"test_r2": 0.5})
    assert better(flipped, {"test_r2": 0.4}, champ)[0]


def test_the_old_field_and_a_metric_the_objective_does_not_report_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"evaluation.min_accuracy is gone: write evaluation.threshold: 0.9"
    ):
        cfg(min_accuracy=0.9)
    with pytest.raises(ValueError, match=r"does not report it; it reports test_mse, test_mae"):
        objective_cfg("regression", metric="test_accuracy")


def test_a_token_accuracy_is_exact_over_the_tokens():
    metrics = {"test_accuracy": 0.9, "test_correct": 27, "test_units": 30, "test_samples": 3}
    assert exact(metrics, "test_accuracy") == Fraction(9, 10)
