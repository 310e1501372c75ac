"""A batch's input or target: a tensor, or a tuple, list or dict of tensors, cut along
the batch dimension of every tensor alike (microbatches, a rank's share) and moved to a
device in one call."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cut", "length", "to_device"]


def cut(x: Any, a: int, b: int) -> Any:
    """Samples ``a:b`` of ``x``, every tensor of it cut alike."""
    if isinstance(x, torch.Tensor):
        return x[a:b]
    if isinstance(x, dict):
        return {k: cut(v, a, b) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(cut(v, a, b) for v in x)
    raise TypeError(f"a batch holds tensors, tuples, lists or dicts, not {type(x).__name__}")


def to_device(x: Any, device: torch.device) -> Any:
    """``x`` on ``device`` (non-blocking: batches are cut on the host)."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    return x


def length(x: Any) -> int:
    """The samples in ``x``: its first tensor's batch dimension."""
    if isinstance(x, torch.Tensor):
        return len(x)
    if isinstance(x, dict):
        return length(next(iter(x.values()))) if x else 0
    if isinstance(x, (tuple, list)):
        return length(x[0]) if x else 0
    raise TypeError(f"a batch holds tensors, tuples, lists or dicts, not {type(x).__name__}")
