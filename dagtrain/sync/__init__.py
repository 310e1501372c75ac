"""Gradient-sync backends behind one interface: horovod, mpi, torch, local.

``get_backend(name)`` imports the backend's module (and so torch, mpi4py or horovod)
only when asked: importing ``dagtrain.sync`` itself is cheap.
"""

from __future__ import annotations

from typing import Any

from .base import Backend, CollectiveTimeout, Handle

__all__ = ["BACKENDS", "Backend", "CollectiveTimeout", "Handle", "get_backend"]

BACKENDS = ("local", "torch", "mpi", "horovod")


def get_backend(name: str, timeout: float = 60.0, **kwargs: Any) -> Backend:
    """Join the process group of backend ``name`` (one of BACKENDS)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(timeout)
    if name == "torch":
        from .torch_dist import TorchBackend

        return TorchBackend(timeout, **kwargs)
    if name == "mpi":
        from .mpi import MPIBackend

        return MPIBackend(timeout)
    if name == "horovod":
        from .horovod import HorovodBackend

        return HorovodBackend(timeout)
    raise ValueError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
