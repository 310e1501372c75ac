"""The one-process backend: nothing to synchronise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .base import Backend, Handle

if TYPE_CHECKING:
    import torch

__all__ = ["LocalBackend"]


class LocalBackend(Backend):
    name = "local"

    def allreduce_async(self, flat: torch.Tensor, what: str, average: bool = True) -> Handle:
        return Handle(what)

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        return None

    def barrier(self) -> None:
        return None

    def broadcast_object(self, obj, root: int = 0):
        return obj
