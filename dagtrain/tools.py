"""Horovod on demand: built (once per machine, ~10 minutes) when a config asks for it.

The default backend (mpi) needs no build, so a newcomer's first run does not wait;
``make test`` builds it always. The build is ``tools/horovod.sh`` of the repository,
which caches the wheel outside it (``~/.cache/dagtrain/wheels``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

__all__ = ["ensure_horovod"]


def ensure_horovod() -> None:
    if importlib.util.find_spec("horovod") is not None:
        return
    repo = Path(__file__).resolve().parents[1]
    script = repo / "tools" / "horovod.sh"
    if not script.exists():
        raise RuntimeError(
            "distributed.backend is horovod but Horovod is not installed in this "
            f"environment ({sys.prefix}); build it with tools/horovod.sh from a dagtrain "
            "checkout, or choose backend mpi"
        )
    print(
        "distributed.backend is horovod: building Horovod 0.28.1 once for this machine "
        "(about 10 minutes; the wheel is cached in ~/.cache/dagtrain/wheels)",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([str(script), sys.prefix], cwd=repo, check=True)
    importlib.invalidate_caches()
