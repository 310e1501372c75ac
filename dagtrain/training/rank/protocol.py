"""What the trainer drives, whichever step a rank runs: :class:`TrainStep`.

Two kinds implement it: the data-parallel step (:class:`~.step.StepGraph`, every rank
holds the whole model and is its own replica) and the pipeline step
(:class:`~.pipeline.StageStep`, a rank trains one stage of one replica).
``tests/unit/training/test_step_protocol.py`` checks that both declare every member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "StepOut", "TrainStep"]

Batch = tuple["torch.Tensor", "torch.Tensor", int]  # features, labels, the global count
StepOut = tuple[float, int, int]  # loss sum over the global batch / world, correct, samples


class TrainStep(Protocol):
    """One rank's training step, built once and run every step.

    ``step``: the steps run (the trainer sets it at the start, from the checkpoint);
    ``completed``: those whose updates are applied; ``skipped``: those skipped for
    non-finite gradients; ``guard``: the lock a step's updates hold (an elastic rank's
    rescue takes it to copy a whole step); ``fetch``: what the step calls for the next
    batch, whose result is ``prefetched`` after a step; ``out``: the last step's
    figures; ``buckets``: the gradient buckets (each with its ``flat`` buffer);
    ``replica``/``replicas``: which share of each global batch this rank reads;
    the recipe (:mod:`.recipe`): ``total``, the run's steps (the trainer sets it: the LR
    is a function of the step and of them), ``precision`` (autocast, fp16's scale, saved
    with a checkpoint), and the last step's ``lr``, gradient ``norm`` before clipping
    (None without clipping) and the ``factor`` it was clipped by (1: not clipped)."""

    step: int
    completed: int
    skipped: int
    guard: AbstractContextManager[Any]
    fetch: Callable[[], Batch | None]
    prefetched: Batch | None
    out: StepOut
    buckets: Sequence[Any]
    replica: int
    replicas: int
    total: int
    precision: Any
    lr: float | None
    norm: float | None
    factor: float

    def run(self, batch: Batch, snapshot: bool = False, trace: str | None = None) -> StepOut:
        """One step on ``batch``; ``snapshot``: call the snapshot callback after it
        (a checkpoint step); ``trace``: write the step's trace there."""
        ...

    def evaluate(self, samples: Any, split: str) -> dict[str, float]:
        """The split's metrics of the model (all ranks call it): rank 0 gets them (a
        pipeline's every rank), the others may get {}."""
        ...

    def optimizer_states(self) -> list[dict[str, Any]]:
        """The optimizer state as the checkpoint holds it: the whole model's, or a
        pipeline stage's part of it (its shard)."""
        ...

    def load_optimizer_states(self, states: list[dict[str, Any]]) -> None:
        """Load what :meth:`optimizer_states` returned (any bucket layout, any split)."""
        ...

    def placement(self) -> dict[str, int]:
        """Where the rank is in a pipeline (``stage``, ``replica``); empty otherwise."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What the result and the page show of the rank's pipeline; None: none."""
        ...

    def close(self) -> None:
        """Remove the hooks, stop the step's threads, undo what it set."""
        ...
