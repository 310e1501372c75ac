"""glibc's malloc, told to keep the memory a step frees for the next step
(``executor.keep_freed_memory``, on by default).

torch's CPU tensors come from ``malloc``. With glibc's defaults a step's large tensors
(a 2048 x 2048 layer's gradient, 16 MiB) are mapped for each allocation or, once glibc
has raised its threshold, taken from the heap, whose top is given back to the system
whenever more than twice that threshold is free at once — as it is at the end of every
step, when the step's gradients and activations go. Either way the next step touches
fresh pages: the 21M-parameter MLP's two-stage pipeline took about 20,000 page faults a
step over its two ranks. Here the rank sets glibc's thresholds once, before it builds
anything: blocks up to :data:`MMAP_THRESHOLD` (glibc's largest) come from the heap, and
the main heap is never trimmed, so a step reuses the pages the step before freed (no
faults after the first step). What the rank holds stays at its peak, which is what the
next step needs again; a tensor larger than the threshold is still mapped and unmapped,
and a thread's own arena (glibc gives busy threads one) still unmaps a heap of its own
that is wholly free. The setting is the process's, for good: a program that calls
:func:`dagtrain.training.train` itself keeps it after the call
(``executor.keep_freed_memory: false`` leaves its malloc alone).

This is what the allocators PyTorch's CPU tuning guide recommends (jemalloc, tcmalloc)
do by default. A rank leaves it alone where the process already chose (:func:`whose`:
one of glibc's malloc variables, a ``glibc.malloc`` tunable, or another allocator
preloaded) and where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD", "keep_freed_memory", "on_glibc", "whose"]

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: never trim, in effect

_GLIBC_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")


def whose(env: Mapping[str, str] | None = None) -> str | None:
    """Who already chose how this process's malloc behaves (a variable's name, or the
    preloaded allocator), or None."""
    env = os.environ if env is None else env
    for name in _GLIBC_VARIABLES:
        if name in env:
            return name
    if "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    preload = env.get("LD_PRELOAD", "")
    return next((f"LD_PRELOAD ({a})" for a in _PRELOADED if a in preload), None)


def on_glibc() -> bool:
    """Whether this process's C library is glibc."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, OSError, ValueError):
        return False


def keep_freed_memory() -> bool:
    """Set glibc's thresholds as the module says; True where they were set, False where
    the process had chosen already or the C library is not glibc."""
    if whose() is not None or not on_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
