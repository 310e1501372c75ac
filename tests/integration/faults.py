"""Faults the integration tests inject into real ranks, and how they look for orphans."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

from benchmarks.elastic_model import read


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


def signal_rank(
    job_dir: Path, pids: Path, rank: int, sig: int, after: str | tuple[str, ...], box: dict
):
    """An ``on_start`` for run_training: ``sig`` to rank ``rank`` (its pid from the
    ``DAGTRAIN_PID_DIR`` folder ``pids``) once ``job_dir / after`` exists (each of them,
    for a tuple); ``box`` gets the time and the pid. Gives up after 90 s."""
    files = (after,) if isinstance(after, str) else after

    def on_start(job):
        def go():
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                written = all((job_dir / f).exists() for f in files)
                if written and (pids / f"rank{rank}.pid").exists():
                    box["at"] = time.monotonic()
                    box["pid"] = int((pids / f"rank{rank}.pid").read_text())
                    os.kill(box["pid"], sig)
                    return
                time.sleep(0.01)

        threading.Thread(target=go, daemon=True).start()

    return on_start


class Faults:
    """``on_start`` for run_training: in the k-th world launched, once each of ranks
    ``ranks`` has started ``at`` steps of it, send them ``sig`` at once (plans[k]:
    ``(ranks, at, sig)``, ``ranks`` one rank or a tuple; None: no fault). Remembers
    every rank pid it saw, to check that none is left, and when it sent each signal."""

    def __init__(self, *plans: tuple[int | tuple[int, ...], int, int] | None) -> None:
        self.plans = list(plans)
        self.worlds = 0
        self.pids: set[int] = set()
        self.sent: list[dict] = []
        self.folder = Path(os.environ["DAGTRAIN_BENCH_STEPS"])

    def __call__(self, job) -> None:
        plan = self.plans[self.worlds] if self.worlds < len(self.plans) else None
        self.worlds += 1
        threading.Thread(target=self._watch, args=(job, plan), daemon=True).start()

    def _watch(self, job, plan) -> None:
        deadline = time.monotonic() + 120
        ranks = () if plan is None else (plan[0],) if isinstance(plan[0], int) else plan[0]
        while time.monotonic() < deadline:
            recs = {r: rec.to_dict() for r, rec in job.records.items()}
            self.pids |= {r["pid"] for r in recs.values() if r.get("job") == job.job_id}
            mine = [recs.get(r, {}) for r in ranks]
            if ranks and all(m.get("job") == job.job_id and m.get("pid") for m in mine):
                steps = [self._steps(m["pid"], r) for m, r in zip(mine, ranks)]
                if all(n >= plan[1] for n in steps):
                    self.sent.append({"ranks": list(ranks), "time": time.time()})  # just before
                    for m in mine:
                        os.kill(m["pid"], plan[2])
                    ranks = ()
            if all(p.poll() is not None for p in job.procs):
                return
            time.sleep(0.001 if ranks else 0.02)

    def _steps(self, pid: int, rank: int) -> int:
        """Steps rank ``rank`` (process ``pid``, of this world) has started."""
        return read(str(self.folder / f"rank{rank}.steps"), pid)[0]

    def left(self) -> list[int]:
        """The rank pids still alive (a stopped zombie counts as gone)."""
        alive = []
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive
