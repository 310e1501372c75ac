"""Backward in two halves, for the zero-bubble orders: the input's gradient first (what
the previous stage waits for), the weights' gradients later (what fills the bubble).

torch has this only as private functions of ``torch.distributed.pipelining._backward``
(what its own ``ScheduleZBVZeroBubble`` uses): they are wrapped here and nowhere else,
and ``tests/unit/training/test_split_backward.py`` fails, naming them, when a torch
release changes or removes them. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["Pending", "input_grad", "weight_grads"]

Pending = list[dict[str, Any]]  # what input_grad keeps for weight_grads: torch's groups


def input_grad(
    out: torch.Tensor,
    dout: torch.Tensor | None,
    inp: torch.Tensor,
    params: Iterable[torch.nn.Parameter],
) -> tuple[torch.Tensor | None, Pending]:
    """The gradient of ``inp`` from ``out``'s (None: ``out`` is the loss), and what
    :func:`weight_grads` needs to finish the parameters' later."""
    from torch.distributed.pipelining._backward import stage_backward_input

    dinputs, pending = stage_backward_input(
        [out], None if dout is None else [dout], [inp], iter(params)
    )
    return dinputs[0], pending


def weight_grads(params: Iterable[torch.nn.Parameter], pending: Pending) -> None:
    """Accumulate the parameters' gradients (into ``.grad``, as backward does; their
    hooks fire) from what :func:`input_grad` kept."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(iter(params), pending)
