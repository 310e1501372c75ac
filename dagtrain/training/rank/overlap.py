"""Which kind of training step runs where overlap is possible: the overlapped one only
while rank 0 measures it faster than the plain one (``distributed.overlap: true``).
Both kinds give the same parameters bit for bit, so the choice changes the speed only.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque

import torch

from dagtrain.sync import Backend

__all__ = ["OverlapChoice"]

log = logging.getLogger("dagtrain.training.rank.step")  # (its decisions are the step's)

# Which step runs, where overlap is possible: the overlapped one only while rank 0
# measures it faster than the plain one. A plain step is timed only after a plain step:
# on 2 ranks sharing 2 cores, one right after an overlapped step ran 3-11% slower (an
# overlapped step after a plain one ran as fast as after an overlapped one), which made
# a trial of alternating steps favour overlap. The first TRIAL_SKIP steps run
# overlapped, untimed (allocations, optimizer state); then TRIAL_STEPS times PLAIN_RUN
# plain steps and an overlapped one give TRIAL_STEPS pairs (the last plain step, the
# overlapped one) and the first verdict: overlap iff the median of the pairs' relative
# differences is below -MARGIN (pairs of neighbouring steps, so that a slow spell of a
# shared machine falls on both halves of a pair). The verdict is reviewed every
# REVIEW_EVERY steps after that: where a review asks for it, the next block ends with a
# probe of the other kind (one overlapped step, or PLAIN_RUN plain ones), paired with
# the kept kind's last timed step; the verdict is the median of the newest WINDOW
# pairs, and overlap, once kept, stays while that is below -KEEP_MARGIN (so that a
# verdict near the margin does not flap). Probes come REVIEW_EVERY steps after the
# trial, then twice as far apart each time one agrees with the verdict (at most
# PROBE_MAX steps apart), every block while they disagree or after a change of
# verdict, and at once when the kept kind's timed steps over a block run DRIFT slower
# than around the last probe or, against the other kind's last probe, say the other
# verdict. Rank 0 decides; one small integer broadcast per review makes every rank run
# the same kind at every step. Both kinds give the same parameters bit for bit, so the
# choice changes the speed only.
TRIAL_SKIP = 1
TRIAL_STEPS = 3
PLAIN_RUN = 2
MARGIN = 0.02
KEEP_MARGIN = 0.01
DRIFT = 0.05
REVIEW_EVERY = 10
PROBE_MAX = 160
WINDOW = 9


class OverlapChoice:
    """Which kind of step runs (True: the overlapped one), from rank 0's step times; the
    rules are above ``TRIAL_SKIP``. Every rank calls ``next`` before each step and
    ``done`` with its seconds after it; ``next`` broadcasts rank 0's verdict at fixed
    steps (every REVIEW_EVERY after the trial), so all ranks call it together."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.runs = 0  # steps run
        self.start = TRIAL_SKIP + (PLAIN_RUN + 1) * TRIAL_STEPS  # of the first verdict
        # (overlapped - plain) / plain of neighbouring timed steps, the newest WINDOW
        self.pairs: deque[float] = deque(maxlen=WINDOW)
        self.kept: bool | None = None  # the verdict (None: still in the trial)
        self.kind = True  # of the step that runs now
        self.prev: bool | None = None  # the kind of the step before
        self.timed: dict[bool, float] = {}  # each kind's last timed step, seconds
        self.block: list[float] = []  # the kept kind's timed steps since the review
        self.probe: range = range(0)  # the steps that run the other kind
        self.probed: float | None = None  # the other kind's last probe, seconds
        self.kept_ref: float | None = None  # the kept kind's median around that probe
        self.last_probe = self.start - 1  # the trial's last step counts as one
        self.interval = REVIEW_EVERY  # steps between probes, for now
        self.log: list[tuple[int, bool, float]] = []  # (step, verdict, median pair)

    def next(self, traced: bool = False, step: int | None = None) -> bool:
        """The kind of the coming step. ``traced``: the step is traced, so it runs the
        kept kind (a probe waits for a later block); ``step``: its number, for the log."""
        r = self.runs
        if r < TRIAL_SKIP:
            self.kind = True
        elif r < self.start:  # PLAIN_RUN plain steps, then an overlapped one
            self.kind = (r - TRIAL_SKIP) % (PLAIN_RUN + 1) == PLAIN_RUN
        else:
            if (r - self.start) % REVIEW_EVERY == 0:
                self._review(r if step is None else step)
            self.kind = bool(self.kept) != (r in self.probe and not traced)
        return self.kind

    def done(self, seconds: float) -> None:
        r, kind = self.runs, self.kind
        timed = kind or self.prev == kind  # not a plain step right after an overlapped one
        self.prev = kind
        self.runs += 1
        if r < TRIAL_SKIP or not timed:
            return
        self.timed[kind] = seconds
        if r < self.start:
            if kind and False in self.timed:  # the overlapped half of a pair
                self.pairs.append(_relative(seconds, self.timed[False]))
        elif kind == self.kept:
            self.block.append(seconds)
        elif self.kept is not None and self.kept in self.timed:  # a probe
            self.probed = seconds
            self.last_probe = r
            kept = self.timed[self.kept]
            over, plain = (seconds, kept) if kind else (kept, seconds)
            self.pairs.append(_relative(over, plain))

    def _review(self, step: int) -> None:
        r = self.runs
        median = statistics.median(self.pairs) if self.pairs else 0.0
        # overlap is taken up where it is MARGIN faster, kept while KEEP_MARGIN faster
        limit = -KEEP_MARGIN if self.kept else -MARGIN
        verdict = median < limit
        kept_median = statistics.median(self.block) if self.block else None
        probed = self.last_probe >= r - REVIEW_EVERY  # in the block that ends here
        if self.kept is None or verdict != self.kept:
            self.interval = REVIEW_EVERY  # a new verdict: check it again soon
        elif probed and self.pairs and (self.pairs[-1] < limit) == self.kept:
            self.interval = min(2 * self.interval, PROBE_MAX)  # the probe agreed
        elif probed:
            self.interval = REVIEW_EVERY  # it did not: probe every block until sure
        drift = False
        if kept_median is not None and self.kept is not None:
            if probed:
                self.kept_ref = kept_median
            # the kept kind slower than around the last probe (the load changed?), or
            # against the other kind's last probe it says the other verdict
            slower = self.kept_ref is not None and kept_median > self.kept_ref * (1 + DRIFT)
            other = False
            if self.probed is not None:
                o, pl = (kept_median, self.probed) if self.kept else (self.probed, kept_median)
                other = (_relative(o, pl) < limit) != self.kept
            drift = slower or other
        probe = r + REVIEW_EVERY - 1 - self.last_probe >= self.interval or drift
        # rank 0's verdict, for every rank: one small integer per review
        cmd = torch.tensor([int(verdict) | int(probe) << 1], dtype=torch.int64)
        self.backend.broadcast([cmd])
        verdict, probe = bool(cmd.item() & 1), bool(cmd.item() & 2)
        if verdict != self.kept:
            if self.kept is None:
                what = "overlap kept" if verdict else "overlap off: the plain step is faster here"
            else:
                what = (
                    "overlap kept again: the overlapped step is faster now"
                    if verdict
                    else "overlap off: the plain step is faster now"
                )
            log.info(
                "rank %d: step %d: %s (the overlapped step %+.1f%% against the plain one, "
                "median of %d pairs of neighbouring steps here; rank 0 decides)",
                self.backend.rank,
                step,
                what,
                100 * median,
                len(self.pairs),
            )
            self.log.append((step, verdict, median))
            if kept_median is not None:  # the kind given up is now the other one
                self.probed = kept_median
            self.kept_ref = None
        self.kept = verdict
        end = r + REVIEW_EVERY  # the probe: the block's last step(s)
        size = PLAIN_RUN if verdict else 1
        self.probe = range(end - size, end) if probe else range(0)
        self.block = []


def _relative(overlapped: float, plain: float) -> float:
    return (overlapped - plain) / plain if plain > 0 else 0.0
