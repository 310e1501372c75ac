"""order: auto's trial (dagtrain.training.rank.order_trial): which order each step runs,
and the verdict from the ranks' averaged medians."""

from __future__ import annotations

import pytest

from dagtrain.training.rank.order_trial import MARGIN, TRIAL_ROUNDS, TRIAL_SKIP, OrderTrial


class Ranks:
    """allreduce(average=True) over ranks whose other members measured ``others``."""

    rank = 0

    def __init__(self, others: list[list[float]]) -> None:
        self.others, self.calls = others, 0

    def allreduce(self, t, what, average=False):
        self.calls += 1
        for o in self.others:
            t += type(t)(o).to(t.dtype)
        if average:
            t /= len(self.others) + 1
        return t


def drive(trial: OrderTrial, seconds: dict[str, float], steps: int) -> list[str]:
    ran = []
    for _ in range(steps):
        o = trial.next()
        ran.append(o)
        trial.done(o, seconds[o])
    return ran


def test_the_candidates_take_turns_then_the_faster_is_kept():
    ranks = Ranks([])
    t = OrderTrial(ranks)
    end = TRIAL_SKIP + TRIAL_ROUNDS * 2
    ran = drive(t, {"1f1b": 1.0, "gpipe": 0.9}, end + 3)
    assert ran[:TRIAL_SKIP] == ["1f1b"] * TRIAL_SKIP
    assert ran[TRIAL_SKIP:end] == ["1f1b", "gpipe"] * TRIAL_ROUNDS
    assert ran[end:] == ["gpipe"] * 3 and t.chosen == "gpipe"
    assert ranks.calls == 1  # one allreduce, at the trial's last step
    d = t.describe()
    assert d["median_step_ms"] == pytest.approx({"1f1b": 1000.0, "gpipe": 900.0})
    assert "gpipe 900.0 ms" in d["why"]


def test_gpipe_must_be_faster_by_the_margin_and_the_ranks_are_averaged():
    near = 1.0 - MARGIN / 2
    t = OrderTrial(Ranks([]))
    drive(t, {"1f1b": 1.0, "gpipe": near}, TRIAL_SKIP + TRIAL_ROUNDS * 2)
    assert t.chosen == "1f1b"  # within the margin: the one that holds fewer activations
    # this rank finds gpipe faster, the other rank much slower: the average decides
    t = OrderTrial(Ranks([[1.0, 2.0]]))
    drive(t, {"1f1b": 1.0, "gpipe": 0.8}, TRIAL_SKIP + TRIAL_ROUNDS * 2)
    assert t.chosen == "1f1b" and t.medians["gpipe"] == pytest.approx(1.4)


def test_an_unfinished_trial_says_so():
    t = OrderTrial(Ranks([]))
    drive(t, {"1f1b": 1.0, "gpipe": 0.5}, 3)
    assert t.chosen is None and t.next() in ("1f1b", "gpipe")
    assert "trial unfinished (3 of 7 steps run)" in t.describe()["why"]


def test_a_traced_step_is_not_timed_and_its_turn_runs_again():
    t = OrderTrial(Ranks([]))
    ran = []
    for k in range(TRIAL_SKIP + TRIAL_ROUNDS * 2 + 1):
        o = t.next()
        ran.append(o)
        traced = k == TRIAL_SKIP + 1  # gpipe's first turn is a traced step
        t.done(o, 5.0 if traced else {"1f1b": 1.0, "gpipe": 0.9}[o], timed=not traced)
    assert ran[TRIAL_SKIP + 1 : TRIAL_SKIP + 3] == ["gpipe", "gpipe"]  # run again
    assert t.chosen == "gpipe" and t.medians["gpipe"] == pytest.approx(0.9)
    assert t.kept == "gpipe"
