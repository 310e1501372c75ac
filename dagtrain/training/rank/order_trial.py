"""Which order a pipeline runs in with ``parallel.order: auto``: the faster of the
candidates, measured on the run's first steps.

The candidates give the same parameters bit for bit (each microbatch's forward, and
each parameter's gradient summed in microbatch order, are the same ops in every one;
zero-bubble's split backward is not: it is chosen by name only), so the trial changes
the speed only. The first TRIAL_SKIP steps run the first candidate untimed
(allocations, the optimizer's state); then the candidates take turns, TRIAL_ROUNDS
steps each (turns, so that a slow spell of a shared machine falls on all of them);
then every rank's median step of each candidate is averaged over the ranks (one small
allreduce, at the same step on every rank) and the fastest is kept for the rest of the
run. gpipe holds every microbatch's activations, 1f1b a few: gpipe is chosen only
where it is MARGIN faster.
"""

from __future__ import annotations

import logging
import statistics

import torch

from dagtrain.sync import Backend

__all__ = ["CANDIDATES", "OrderTrial"]

log = logging.getLogger("dagtrain.training.rank.pipelining")  # (its decisions are the step's)

CANDIDATES = ("1f1b", "gpipe")  # the first: the one kept on a tie, and before a verdict
TRIAL_SKIP = 1
TRIAL_ROUNDS = 3
MARGIN = 0.02


class OrderTrial:
    """Every rank calls :meth:`next` before each step and :meth:`done` with its seconds
    after it; the verdict comes in :meth:`done` of the trial's last step, on every rank
    together."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.candidates = CANDIDATES
        self.runs = 0
        self.end = TRIAL_SKIP + TRIAL_ROUNDS * len(CANDIDATES)
        self.times: dict[str, list[float]] = {o: [] for o in CANDIDATES}
        self.chosen: str | None = None
        self.medians: dict[str, float] = {}  # seconds, averaged over the ranks

    def next(self) -> str:
        """The order of the coming step."""
        if self.chosen is not None:
            return self.chosen
        r = self.runs
        if r < TRIAL_SKIP:
            return self.candidates[0]
        return self.candidates[(r - TRIAL_SKIP) % len(self.candidates)]

    def done(self, order: str, seconds: float, timed: bool = True) -> None:
        """``timed``: False for a traced step (it counts activations, ~5% slower): the
        trial's turn is run again (every rank traces the same steps, so every rank
        still decides at the same step)."""
        r = self.runs
        if self.chosen is None and r >= TRIAL_SKIP and not timed:
            return
        self.runs += 1
        if self.chosen is not None or r < TRIAL_SKIP:
            return
        self.times[order].append(seconds)
        if self.runs == self.end:
            self._decide()

    def _decide(self) -> None:
        got = torch.tensor(
            [statistics.median(self.times[o]) for o in self.candidates], dtype=torch.float64
        )
        self.backend.allreduce(got, "the pipeline order trial's step times", average=True)
        self.medians = dict(zip(self.candidates, got.tolist()))
        first = self.candidates[0]
        best = min(self.candidates, key=lambda o: self.medians[o])
        if self.medians[best] > self.medians[first] * (1 - MARGIN):
            best = first
        self.chosen = best
        if self.backend.rank == 0:  # (every rank decides alike: one line for the run)
            log.info("pipeline order auto: %s, %s", best, self.why())

    @property
    def kept(self) -> str:
        """The order kept: the verdict, or before it the first candidate (the one the
        run keeps if it ends before its trial does)."""
        return self.chosen or self.candidates[0]

    def why(self) -> str:
        """What the trial measured, in words (for the log and the result)."""
        if self.chosen is None:
            return f"trial unfinished ({self.runs} of {self.end} steps run): {self.candidates[0]}"
        times = ", ".join(f"{o} {self.medians[o] * 1e3:.1f} ms" for o in self.candidates)
        return (
            f"the median step over {TRIAL_ROUNDS} steps each, averaged over the ranks: "
            f"{times} (gpipe only where {MARGIN:.0%} faster: it holds every microbatch)"
        )

    def describe(self) -> dict:
        return {
            "chosen": self.chosen,
            "median_step_ms": {o: round(t * 1e3, 3) for o, t in self.medians.items()},
            "why": self.why(),
        }
