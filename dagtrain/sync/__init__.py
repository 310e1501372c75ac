"""Gradient-sync backends behind one interface: horovod, mpi, torch, local.

``get_backend(name)`` imports the backend's module (and so torch, mpi4py or horovod)
only when asked: importing ``dagtrain.sync`` itself is cheap.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, get_args

from dagtrain.config import BackendName
from dagtrain.errors import MissingDependency

from .base import GAVE_UP, Backend, CollectiveFailed, CollectiveTimeout, Handle

__all__ = [
    "BACKENDS",
    "GAVE_UP",
    "Backend",
    "CollectiveFailed",
    "CollectiveTimeout",
    "Handle",
    "get_backend",
    "require",
]

BACKENDS: tuple[str, ...] = get_args(BackendName)

# what each backend imports, and how to install it where it is missing
_NEEDS = {
    "local": ("torch", "pip install 'airflow-provider-dagtrain[train]'"),
    "torch": ("torch", "pip install 'airflow-provider-dagtrain[train]'"),
    "mpi": ("mpi4py", "pip install 'airflow-provider-dagtrain[train]' (mpi4py and Open MPI)"),
    "horovod": (
        "horovod",
        "`make horovod` in a dagtrain checkout, or `tools/horovod.sh VENV` (it builds "
        "Horovod 0.28.1 against this torch once, about 10 minutes, and caches the wheel)",
    ),
}


def require(name: str) -> None:
    """Raise MissingDependency, with the command that installs it, if backend ``name``
    cannot be imported in this environment; a cheap check, done before any rank starts."""
    module, how = _NEEDS[name]
    if importlib.util.find_spec(module) is None:
        raise MissingDependency(
            f"distributed.backend is {name} but {module} is not installed in this "
            f"environment ({sys.prefix}); install it with {how}"
            + ("; or choose distributed.backend mpi" if name == "horovod" else "")
        )


def get_backend(name: str, timeout: float = 60.0, device: str = "cpu", **kwargs: Any) -> Backend:
    """Join the process group of backend ``name`` (one of BACKENDS) for a rank that
    trains on ``device`` (``cpu``, or ``cuda:N``: NCCL for torch, buckets staged
    through host memory for mpi4py, Horovod's own GPU operations)."""
    if name == "local":
        from .local import LocalBackend

        backend: Backend = LocalBackend(timeout)
        backend.device = device
        return backend
    if name == "torch":
        from .torch_dist import TorchBackend

        return TorchBackend(timeout, device=device, **kwargs)
    if name == "mpi":
        from .mpi import MPIBackend

        return MPIBackend(timeout, device=device)
    if name == "horovod":
        from .horovod import HorovodBackend

        return HorovodBackend(timeout, device=device)
    raise ValueError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
