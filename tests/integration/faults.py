"""Faults the integration tests inject into real ranks, and how they look for orphans."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead for our purposes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def signal_rank(job_dir: Path, pids: Path, rank: int, sig: int, after: str, box: dict):
    """An ``on_start`` for run_training: ``sig`` to rank ``rank`` (its pid from the
    ``DAGTRAIN_PID_DIR`` folder ``pids``) once ``job_dir / after`` exists; ``box`` gets
    the time and the pid. Gives up after 90 s."""

    def on_start(job):
        def go():
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if (job_dir / after).exists() and (pids / f"rank{rank}.pid").exists():
                    box["at"] = time.monotonic()
                    box["pid"] = int((pids / f"rank{rank}.pid").read_text())
                    os.kill(box["pid"], sig)
                    return
                time.sleep(0.01)

        threading.Thread(target=go, daemon=True).start()

    return on_start
