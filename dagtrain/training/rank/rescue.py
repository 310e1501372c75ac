"""An elastic rank's rescue: its last completed step, saved as it is made to stop.

In data parallelism every rank holds the whole model and optimizer state after each
step, so when a peer is lost a survivor can save the last step it completed: only the
step in flight is lost. In an elastic run (``distributed.min_ranks`` < ``ranks``) every
rank arms a :class:`Rescue`, which runs when the rank is made to stop
(``dagtrain.rank_env.stopping``):

- the launcher's SIGTERM (ours, mpirun's, torchrun's, as they stop the survivors of a
  lost rank): read by a thread of its own from ``signal.set_wakeup_fd``, so that a main
  thread blocked in a collective that will never finish does not delay it;
- a collective's watchdog, as it gives up on a stalled peer;
- the rank's own error path (gloo raises as soon as a peer's connection closes).

The rescue takes ``StepGraph.guard``, which a step's updates hold (in an elastic run
they run as one task, after every allreduce of the step): it copies the state as of
the step before them, or after all of them, never half a step. It writes the copy with
``checkpoint.save`` (atomic, checksummed) into ``<checkpoint_dir>/rescue/rank<N>/``,
records ``rescued`` (the step) in the rank's status record, and the process exits. The
next world's rank 0 resumes from the newest valid checkpoint or rescue
(:func:`newest`), saves it as the run's checkpoint and removes the rescues.

Under mpirun the survivors get about 0.25 s between PRRTE's SIGTERM and its SIGKILL; a
state that takes longer to write falls back to the newest periodic checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagtrain.rank_env import JOB_ID, on_stop, this_rank

from . import checkpoint

__all__ = ["RESCUE_DIR", "Rescue", "newest", "remove_rescues"]

RESCUE_DIR = "rescue"  # beside the checkpoints: <checkpoint_dir>/rescue/rank<N>/
LOCK_WAIT = 10.0  # seconds a rescue waits for a step's updates to end (they take ms)


class Rescue:
    """Saves ``capture()`` (a state dict with ``step``, or None: nothing to save) into
    ``<checkpoint_dir>/rescue/rank<rank>`` under ``guard`` when the rank is made to
    stop; see the module docstring."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        rank: int,
        guard: threading.Lock,
        capture: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.directory = Path(checkpoint_dir) / RESCUE_DIR / f"rank{rank}"
        self.rank = rank
        self.guard = guard
        self.capture = capture
        self.saved: int | None = None

    def arm(self) -> None:
        """Run :meth:`save` when the rank is made to stop; a SIGTERM makes it stop."""
        on_stop(self.save)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers live in the main thread (tests call train there)
        read, write = os.pipe()
        os.set_blocking(write, False)
        # the handler itself does nothing: the C-level handler writes the signal's
        # number into the pipe at once, whatever the main thread is blocked in
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(
            target=self._on_sigterm, args=(read,), name="dagtrain-rescue", daemon=True
        ).start()

    def _on_sigterm(self, fd: int) -> None:
        while os.read(fd, 1) != bytes([signal.SIGTERM]):
            pass
        try:
            from dagtrain.rank_env import stopping

            stopping("the launcher stopped this rank (SIGTERM)")
        finally:
            sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)

    def save(self, why: str) -> None:
        if not self.guard.acquire(timeout=LOCK_WAIT):
            print(
                f"dagtrain rank {self.rank}: no rescue: the step's updates did not end "
                f"within {LOCK_WAIT:g} s",
                file=sys.stderr,
                flush=True,
            )
            return
        try:
            state = self.capture()  # copies: the updates may go on once released
        finally:
            self.guard.release()
        if state is None:
            return
        state["job"] = os.environ.get(JOB_ID, "")
        checkpoint.save(state, self.directory, int(state["step"]), keep=1)
        self.saved = int(state["step"])
        this_rank().write(rescued=self.saved)
        print(
            f"dagtrain rank {self.rank} saved its last completed step, {self.saved}, "
            f"before stopping ({why})",
            file=sys.stderr,
            flush=True,
        )


def newest(
    checkpoint_dir: str | Path, keys: set[str] | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest valid state in ``checkpoint_dir``: its newest checkpoint, or a rescue
    of a later step, in the checkpoint's format. A rescue's ``sums`` are its rank's
    own: those of the rescues of the same step and job are added to the ``carried``
    figures, so the epoch's running figures count every survivor's samples (a lost
    rank's since the launch are gone). ``keys``: a pipeline stage's (see
    :func:`.checkpoint.load`)."""
    found = checkpoint.latest(checkpoint_dir, keys)
    rescues = []
    for d in sorted((Path(checkpoint_dir) / RESCUE_DIR).glob("rank*")):
        got = checkpoint.latest(d)
        if got is not None:
            rescues.append(got)
    if not rescues:
        return found
    step = max(int(s["step"]) for _, s in rescues)
    if found is not None and int(found[1]["step"]) >= step:
        return found
    best = [(p, s) for p, s in rescues if int(s["step"]) == step]
    path, state = best[0]
    same = [s for _, s in best if s.get("job") == state.get("job")]
    own = [json.loads(s["sums"]) for s in same]
    totals = [sum(col) for col in zip(json.loads(state["carried"]), *own)]
    state = {k: v for k, v in state.items() if k not in ("job", "carried")}
    return path, {**state, "sums": json.dumps(totals)}


def remove_rescues(checkpoint_dir: str | Path) -> None:
    """Remove the rescues (once their state is the run's checkpoint)."""
    shutil.rmtree(Path(checkpoint_dir) / RESCUE_DIR, ignore_errors=True)
