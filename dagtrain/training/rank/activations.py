"""The bytes of the activations a pipeline stage holds: what autograd saved in each
microbatch's forward until its backward frees it, and the most alive in any step (the
figure the orders promise to bound: ``peak_activation_bytes``)."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

__all__ = ["ActivationBytes"]

Regions = dict[int, set[tuple[int, int]]]  # storage -> byte ranges [a, b) saved in it


class ActivationBytes:
    """``counting()`` around a forward gives the regions it saved; ``held(regions)``
    adds their bytes to those alive (``live``, ``peak``), ``freed(nbytes)`` takes them
    off as the backward ends. Thread-safe: the stage's tasks may run on workers."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {q.untyped_storage().data_ptr() for q in model.parameters()}
        self.live = 0
        self.peak = 0
        self._lock = threading.Lock()

    def counting(self) -> tuple[Regions, AbstractContextManager[Any]]:
        """The bytes of the tensors autograd saves in a forward (parameters excluded; in
        each storage, the union of the regions saved, so a microbatch saved as a view of
        its batch counts its own rows, a tensor saved twice once) and the hooks that
        count them. ``pack`` keeps a detached alias: the tensor itself would tie its
        ``grad_fn`` to the graph that saves it, a cycle the split backward never frees."""
        regions: Regions = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in self._params and t.numel() and t.device.type != "meta":
                size = t.element_size()
                start = t.storage_offset() * size
                extent = 1 + sum((n - 1) * abs(k) for n, k in zip(t.shape, t.stride()))
                regions.setdefault(ptr, set()).add((start, start + extent * size))
            return t.detach()

        return regions, torch.autograd.graph.saved_tensors_hooks(pack, _unpack)

    def held(self, regions: Regions) -> int:
        """Count a forward's saved regions as alive; their bytes."""
        nbytes = sum(_union(r) for r in regions.values())
        with self._lock:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        return nbytes

    def freed(self, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _union(regions: set[tuple[int, int]]) -> int:
    """Bytes covered by byte ranges [a, b)."""
    total, end = 0, -1
    for a, b in sorted(regions):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
