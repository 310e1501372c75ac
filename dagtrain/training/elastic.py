"""An elastic run's launching side: the world its ranks run on, and its changes.

With ``distributed.min_ranks`` below ``ranks``, a lost rank or host does not fail the
try. The survivors save their last completed step (:mod:`.rescue`), the job is
stopped, and :func:`run_elastic` launches the ranks again on the slots that answer,
as many as there are, at least ``min_ranks``, no more than ``ranks``. The next world's
rank 0 resumes from the rescue, the global batch and the sample order unchanged
(each rank's share of a batch is cut for the new world size). A change of world is a
relaunch, the same for mpi, torch and horovod.

- **Lost**: a rank killed by a signal, stalled past ``collective_timeout``, or lost
  with its host. Its slot is left out; a host that does not answer a probe (its rsh
  agent running ``true``) is left out whole. A rank that failed on its own error (bad
  input, a bug, non-finite gradients) is not a loss: the try fails as before.
- **Back**: with ``distributed.regrow``, the hosts of left-out slots are probed every
  ``PROBE_EVERY`` seconds while the run goes on; when one answers, the ranks are asked
  to stop at their next epoch's end (``rank_env.REGROW``), checkpointed, and are
  launched again on the larger world. A host lost twice in a try (flapping) stays out
  for the rest of the try.
- **Bounds**: ``distributed.max_world_changes`` changes (losses and returns) a try;
  past it, or below ``min_ranks``, the try fails as a non-elastic one does, naming the
  rank and the host, and Airflow's retry resumes from the checkpoint. Every try first
  probes the hosts and starts on those that answer.

Each change is a dict (``WorldChange``): ``change`` (``shrink``/``grow``), ``step``
(where the new world starts), ``from``/``to`` (ranks), ``ranks`` (the ranks lost, as the
old world numbered them), ``hosts``, ``why``, ``steps_lost`` (steps trained again: the
step in flight, and any completed after the newest saved state), ``seconds`` (from the
loss to the new world's first completed step), ``time``. ``on_change`` gets each one as
it is complete; the result carries them all (``TrainResult.world_changes``).

Importing this module imports no torch.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagtrain.config import TrainConfig
from dagtrain.launch import Hosts, Job, RankFailure, RankInputError, answers
from dagtrain.launch.diagnose import STALLED, stalled_rank
from dagtrain.rank_env import REGROW

__all__ = ["PROBE_EVERY", "World", "is_loss", "run_elastic"]

PROBE_EVERY = 2.0  # seconds between two probes of the left-out hosts while a world runs
PROBE_TIMEOUT = 5.0  # seconds a host has to answer a probe
FIRST_STEP_WAIT = 120.0  # seconds a new world's first step is waited for, to time it


def _local() -> str:
    """This host's name, as its ranks report it in their records."""
    import socket

    return socket.gethostname()


@dataclass
class World:
    """The slots of a run (``host -> ranks``, in the host list's order) and those left
    out: until their host answers again (``out``), or for the rest of the try
    (``banned``, a host lost twice)."""

    slots: dict[str, int]
    ranks: int
    out: Counter = field(default_factory=Counter)
    losses: Counter = field(default_factory=Counter)
    banned: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, hosts: Hosts | None, ranks: int) -> World:
        """The world of ``ranks`` ranks placed on ``hosts`` (this host when None) as the
        launchers place them (slots in order, wrapping around past the last)."""
        placed = hosts.placement(ranks) if hosts is not None else [_local()] * ranks
        return cls(dict(Counter(placed)), ranks)

    def free(self, host: str) -> int:
        return self.slots[host] - self.out[host]

    @property
    def size(self) -> int:
        return min(self.ranks, sum(self.free(h) for h in self.slots))

    def lose(self, host: str, whole: bool) -> None:
        """A rank on ``host`` was lost (``whole``: the host with it)."""
        self.losses[host] += 1
        self.out[host] = self.slots[host] if whole else min(self.slots[host], self.out[host] + 1)
        if self.losses[host] >= 2:
            self.banned.add(host)

    def waiting(self) -> list[str]:
        """The hosts with slots left out that may come back."""
        return [h for h in self.slots if self.out[h] and h not in self.banned]

    def take_back(self, host: str) -> None:
        self.out[host] = 0

    def hosts_for(self, spec: Hosts | None) -> Hosts | None:
        """The host list of the world now (None: this host alone)."""
        if spec is None:
            return None
        left, entries = self.size, []
        for h in self.slots:
            n = min(self.free(h), left)
            if n > 0:
                entries.append(f"{h}:{n}")
                left -= n
        return Hosts(tuple(entries), spec.rsh_agent, spec.env, spec.rdzv_port, spec.source)


def is_loss(e: RankFailure, job: Job | None = None) -> bool:
    """Whether ``e`` is a lost rank (killed by a signal, stalled, or lost with its
    host), which an elastic run survives, and not a rank's own error. A rank that gave
    up waiting for a peer (a timeout, a peer's connection gone) is a symptom of one."""
    if isinstance(e, RankInputError):
        return False
    if e.signal is not None or e.how.startswith((STALLED, "was lost with its host")):
        return True
    if job is not None and stalled_rank(job) is not None:
        return True
    return bool(_PEER_GONE.search(e.error_message or "")) or (
        e.error_type is None and e.exit_code in (None, 70, 143)
    )


# what a rank's error says when it gave up on a peer (ours, gloo's, NCCL's, MPI's)
_PEER_GONE = re.compile(
    r"did not finish within|[Tt]imed out|Connection (closed|reset) by peer|Broken pipe"
)


def _host_of(job: Job | None, rank: int | None, spec: Hosts | None) -> str:
    """The host list's name of the host ``rank`` ran on."""
    if spec is None or rank is None:
        return _local()
    if job is not None and rank in job.node_of_rank:
        return job.node_hosts[job.node_of_rank[rank]]
    return spec.placement(rank + 1)[rank]


def run_elastic(
    cfg: TrainConfig,
    spec: Hosts | None,
    launch_world: Callable[[TrainConfig, Hosts | None, Callable[[Job], None]], Any],
    status_dir: Path,
    on_change: Callable[[dict[str, Any]], None] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Any:
    """Launch ``cfg``'s ranks with ``launch_world(cfg, hosts, on_start)`` (which returns
    rank 0's TrainResult or raises RankFailure), again after each loss and return (see
    the module docstring); the last world's TrainResult, with ``world_changes``."""
    d = cfg.distributed
    say = on_line or (lambda line: None)
    world = World.of(spec, d.ranks)
    for host in _silent(spec, list(world.slots)):  # every try starts on the hosts that answer
        world.out[host] = world.slots[host]
        say(f"dagtrain: host {host} does not answer: this try starts without it")
    changes: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    began: dict[str, Any] = {}  # the first world's rank 0 record: where the try began
    while True:
        n = world.size
        if n < d.fewest_ranks:
            raise RankFailure(
                None,
                None,
                None,
                [],
                how=f"could not start: {n} rank(s) answer, fewer than distributed.min_ranks "
                f"{d.fewest_ranks} (left out: {', '.join(world.waiting() + sorted(world.banned))})",
            )
        hosts = world.hosts_for(spec)
        (status_dir / REGROW).unlink(missing_ok=True)
        jobs: list[Job] = []
        stop = threading.Event()
        grow = len(changes) < d.max_world_changes and d.regrow
        prober = threading.Thread(
            target=_probe_left_out, args=(world, spec, status_dir, stop, grow), daemon=True
        )
        timer: threading.Thread | None = None

        def started(
            job: Job,
            change: dict[str, Any] | None = pending,
            jobs: list[Job] = jobs,
            stop: threading.Event = stop,
        ) -> None:
            nonlocal timer
            jobs.append(job)
            if change is not None:
                timer = threading.Thread(
                    target=_time_recovery, args=(job, change, stop, on_change), daemon=True
                )
                timer.start()

        run_cfg = cfg.model_copy(update={"world": n if n != d.ranks else None})
        prober.start()
        try:
            result = launch_world(run_cfg, hosts, started)
        except RankFailure as e:
            stop.set()
            _settle(timer, pending, on_change)
            job = jobs[-1] if jobs else None
            began = began or _began(job)
            loss = is_loss(e, job)
            if not loss or len(changes) >= d.max_world_changes:
                if loss:
                    say(
                        f"dagtrain: {d.max_world_changes} world change(s) made already "
                        "(distributed.max_world_changes): this loss fails the try"
                    )
                raise
            lost, why = e.rank, e.summary
            quiet = stalled_rank(job) if job is not None else None
            if quiet is not None and quiet != e.rank:  # e names a rank that gave up on it
                lost, why = quiet, f"rank {quiet} stopped answering; {e.summary}"
            host = _host_of(job, lost, spec)
            # the job starts again on the hosts that answer: the lost rank's, and any
            # other that went with it
            silent = _silent(spec, [h for h in world.slots if world.free(h)])
            whole = host in silent or e.how.startswith("was lost with its host")
            world.lose(host, whole)
            for other in silent:
                if other != host:
                    world.out[other] = world.slots[other]
                    say(f"dagtrain: host {other} does not answer either: left out")
            pending = {
                "kind": "world",
                "change": "shrink",
                "step": None,
                "from": n,
                "to": world.size,
                "ranks": [lost] if lost is not None else [],
                "hosts": [host, *(h for h in silent if h != host)],
                "why": why,
                "steps_lost": None,
                "seconds": None,
                "time": time.time(),
                "_reached": _reached(job),
            }
            if world.size < d.fewest_ranks:  # no change of world: the try fails
                say(
                    f"dagtrain: {why}; {world.size} rank(s) left, fewer than "
                    f"distributed.min_ranks {d.fewest_ranks}: the try fails"
                )
                raise
            changes.append(pending)
            say(
                f"dagtrain: {why}; going on with {world.size} of {d.ranks} rank(s)"
                + (f" (host {host} left out)" if whole else "")
            )
            continue
        finally:
            stop.set()
            prober.join(timeout=PROBE_TIMEOUT + 1)
        _settle(timer, pending, on_change)
        pending = None
        began = began or _began(jobs[-1] if jobs else None)
        if result.stopped_for != "regrow":
            result.world_changes = [_public(c) for c in changes]
            if changes and began:  # what this try did: from where its first world began
                start = int(began.get("start_step") or 0)
                result.resumed_from_step = start or None
                result.resumed_epochs = int(began.get("resumed_epochs") or 0)
            return result
        back = [h for h in world.waiting() if answers(spec, h, PROBE_TIMEOUT)]
        if not back:  # it answered the probe, not now: the same world again
            say("dagtrain: the host that answered does not now: going on as before")
            continue
        for h in back:
            world.take_back(h)
        pending = {
            "kind": "world",
            "change": "grow",
            "step": result.steps,
            "from": n,
            "to": world.size,
            "ranks": [],
            "hosts": back,
            "why": f"host {', '.join(back)} answers again",
            "steps_lost": 0,
            "seconds": None,
            "time": time.time(),
        }
        changes.append(pending)
        say(f"dagtrain: {pending['why']}: going on with {world.size} of {d.ranks} rank(s)")


def _silent(spec: Hosts | None, hosts: list[str]) -> list[str]:
    """The hosts of ``hosts`` that do not answer a probe, probed side by side (this
    host answers at once)."""
    if spec is None:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(hosts))) as pool:
        answered = list(pool.map(lambda h: answers(spec, h, PROBE_TIMEOUT), hosts))
    return [h for h, ok in zip(hosts, answered) if not ok]


def _public(change: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in change.items() if not k.startswith("_")}


def _began(job: Job | None) -> dict[str, Any]:
    """Rank 0's record of ``job`` once it started training (``start_step``,
    ``resumed_epochs``), else nothing."""
    rec = job.records.get(0, {}) if job is not None else {}
    return rec if rec.get("start_step") is not None else {}


def _reached(job: Job | None) -> int | None:
    """The most steps any rank of ``job`` had completed, as their records say."""
    if job is None:
        return None
    job.refresh()
    steps = [int(r["step"]) for r in job.records.values() if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def _probe_left_out(
    world: World, spec: Hosts | None, status_dir: Path, stop: threading.Event, grow: bool
) -> None:
    """While a world runs: probe the hosts of its left-out slots; when one answers, ask
    the ranks to stop at their next epoch's end (``REGROW``)."""
    while grow and world.waiting() and not stop.wait(PROBE_EVERY):
        if any(answers(spec, h, PROBE_TIMEOUT) for h in world.waiting()):
            (status_dir / REGROW).write_text("a left-out host answers again\n")
            return


def _time_recovery(
    job: Job,
    change: dict[str, Any],
    stop: threading.Event,
    on_change: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Complete ``change`` once the new world's rank 0 has completed its first step: the
    step it started at, the steps lost, the seconds since the loss."""
    deadline = time.monotonic() + FIRST_STEP_WAIT
    while True:
        # (once more after the world ended: its last records are read as it ends, and a
        # short world may end between two looks)
        ended = stop.is_set() or time.monotonic() > deadline
        rec = job.records.get(0) or {}
        if rec.get("first_step_time") is not None and rec.get("start_step") is not None:
            change["step"] = int(rec["start_step"])
            change["seconds"] = round(float(rec["first_step_time"]) - change["time"], 3)
            reached = change.get("_reached")
            if reached is not None and change["change"] == "shrink":
                change["steps_lost"] = max(0, reached + 1 - change["step"])
            break
        if ended:
            break
        time.sleep(0.05)
    change.pop("_reached", None)
    if on_change is not None:
        on_change(_public(change))
    change["_told"] = True


def _settle(
    timer: threading.Thread | None,
    change: dict[str, Any] | None,
    on_change: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Wait for the timing of ``change``; tell it untimed if no timer ran (the world
    failed before it started)."""
    if timer is not None:
        timer.join(timeout=FIRST_STEP_WAIT)
    elif change is not None and not change.get("_told") and on_change is not None:
        change.pop("_reached", None)
        on_change(_public(change))
        change["_told"] = True
