"""An elastic run's launching side: the world its ranks run on, and its changes.

With ``distributed.min_ranks`` below ``ranks``, a lost rank or host does not fail the
try. The survivors save their last completed step (:mod:`dagtrain.training.rank.rescue`), the job is
stopped, and :func:`run_elastic` launches the ranks again, on the slots that answer,
as many as there are, at least ``min_ranks``, no more than ``ranks``. The next world's
rank 0 resumes from the rescue, the global batch and the sample order unchanged
(each rank's share of a batch is cut for the new world size). A change of world is a
relaunch, the same for mpi, torch and horovod. A pipeline's world (``parallel.stages``
S > 1) is whole replicas, S x D' ranks; its survivors save nothing (a stage's state
alone is no model) and its stages resume from the newest sharded checkpoint.

- **Lost**: a rank killed by a signal, stalled past ``collective_timeout``, or lost
  with its host; every rank lost at once is named (:func:`lost_ranks`). A rank that
  failed on its own error (bad input, a bug, non-finite gradients) is not a loss: the
  try fails as before.
- **Where it goes on**: a lost rank's slot on a host that still answers is used again
  at once, by a new process (``restart``: the same world size, as torchrun's restarts
  do), unless that slot already lost a rank in this try: then it is left out for the
  rest of the try (``shrink``). A host that does not answer a probe (its rsh agent
  running ``true``) is left out whole (``shrink``).
- **Back**: with ``distributed.regrow``, the hosts left out because they did not
  answer are probed every ``PROBE_EVERY`` seconds while the run goes on; when one
  answers, the ranks are asked to stop at their next epoch's end
  (``rank_env.REGROW``), checkpointed, and are launched again on the larger world
  (``grow``). A host lost twice in a try (flapping) stays out for the rest of the try.
- **Bounds**: ``distributed.max_world_changes`` changes (relaunches, losses and
  returns) a try; past it, or below ``min_ranks``, the try fails as a non-elastic one
  does, naming the rank and the host, and why in its first sentence; Airflow's retry
  resumes from the checkpoint. Every try first probes the hosts and starts on those
  that answer.

Each change is a :class:`~dagtrain.records.metrics.WorldChange`, told and kept as its
public fields (a ``world`` line of the metrics file): ``change`` (``restart``/``shrink``/``grow``),
``step`` (where the new world starts), ``from``/``to`` (ranks), ``ranks`` (the ranks
lost, as the old world numbered them), ``hosts``, ``why``, ``steps_lost`` (steps
trained again: the step in flight, and any completed after the newest saved state),
``seconds`` (from the loss, i.e. the lost rank's end as first seen, or a stalled
rank's last heartbeat, to the new world's first completed step), ``time`` (of the
loss). ``on_change`` gets each one as it is complete; the result carries them all
(``TrainResult.world_changes``).

Importing this module imports no torch.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagtrain.config import DistributedConfig, TrainConfig
from dagtrain.launch import Hosts, Job, RankFailure, RankInputError, answers
from dagtrain.launch.diagnose import PEER_GONE, STALLED, stalled_rank
from dagtrain.rank_env import REGROW
from dagtrain.records.metrics import WorldChange
from dagtrain.records.status import RankRecord, State
from dagtrain.sync import GAVE_UP

__all__ = ["PROBE_EVERY", "World", "is_loss", "lost_ranks", "run_elastic"]

# the exit code a launcher reports for a rank ended by SIGTERM (the shell's 128 + 15)
TERMINATED = 128 + signal.SIGTERM
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
    out: a host that does not answer, whole, until it answers again (``silent``), or
    for the rest of the try once lost twice (``banned``); a slot that failed twice on a
    host that answers, for the rest of the try (``dropped``)."""

    slots: dict[str, int]
    ranks: int
    unit: int = 1  # a world's size is a multiple of it: a pipeline's stages
    out: Counter = field(default_factory=Counter)  # host -> its slots left out now
    silent: set[str] = field(default_factory=set)
    losses: Counter = field(default_factory=Counter)  # host -> times lost whole
    banned: set[str] = field(default_factory=set)
    failures: Counter = field(default_factory=Counter)  # (host, slot) -> its ranks lost
    dropped: Counter = field(default_factory=Counter)  # host -> its slots out for the try

    @classmethod
    def of(cls, hosts: Hosts | None, ranks: int, unit: int = 1) -> World:
        """The world of ``ranks`` ranks placed on ``hosts`` (this host when None) as the
        launchers place them (slots in order, wrapping around past the last), of a size
        that is a multiple of ``unit`` (a pipeline's stages: whole replicas)."""
        placed = hosts.placement(ranks) if hosts is not None else [_local()] * ranks
        return cls(dict(Counter(placed)), ranks, unit)

    def free(self, host: str) -> int:
        return self.slots[host] - self.out[host]

    @property
    def size(self) -> int:
        n = min(self.ranks, sum(self.free(h) for h in self.slots))
        return n - n % self.unit

    def leave_out(self, host: str) -> None:
        """``host`` does not answer: every slot of it is out until it does."""
        self.out[host] = self.slots[host]
        self.silent.add(host)

    def lose_host(self, host: str) -> None:
        """``host`` was lost with a rank of it (a second time: it stays out)."""
        self.losses[host] += 1
        self.leave_out(host)
        if self.losses[host] >= 2:
            self.banned.add(host)

    def lose_slot(self, host: str, slot: int) -> bool:
        """A rank was lost in ``host``'s slot ``slot`` (its index among that host's
        ranks) while the host answers: True when the slot is used again at once (its
        first loss in the try), False when it is left out for the rest of the try."""
        self.failures[host, slot] += 1
        if self.failures[host, slot] == 1:
            return True
        self.dropped[host] = min(self.slots[host], self.dropped[host] + 1)
        self.out[host] = max(self.out[host], self.dropped[host])
        return False

    def waiting(self) -> list[str]:
        """The hosts left out that may come back: those that stopped answering."""
        return [h for h in self.slots if h in self.silent and h not in self.banned]

    def take_back(self, host: str) -> None:
        self.silent.discard(host)
        self.out[host] = self.dropped[host]

    def grows_with(self, hosts: list[str]) -> bool:
        """Whether taking ``hosts`` back makes the world larger (a pipeline's grows by
        whole replicas only)."""
        free = sum(self.free(h) for h in self.slots)
        free += sum(self.out[h] - self.dropped[h] for h in hosts if h in self.silent)
        n = min(self.ranks, free)
        return n - n % self.unit > self.size

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
    return bool(PEER_GONE.search(e.error_message or "")) or (
        e.error_type is None and e.exit_code in (None, GAVE_UP, TERMINATED)
    )


def _host_of(job: Job | None, rank: int | None, spec: Hosts | None) -> str:
    """The host list's name of the host ``rank`` ran on (in ``job``'s world, which may
    be smaller than the host list)."""
    if spec is None or rank is None:
        return _local()
    if job is not None and rank in job.node_of_rank:
        return job.node_hosts[job.node_of_rank[rank]]
    listed = job.hosts if job is not None and job.hosts is not None else spec
    return listed.placement(rank + 1)[rank]


def _slot(job: Job | None, rank: int, spec: Hosts | None) -> int:
    """Which of its host's slots ``rank`` ran in: its index among that host's ranks."""
    host = _host_of(job, rank, spec)
    return sum(1 for q in range(rank) if _host_of(job, q, spec) == host)


def lost_ranks(e: RankFailure, job: Job | None, quiet: int | None = None) -> list[int]:
    """Every rank lost in ``e``'s loss, the one it names first (``quiet``: the rank that
    stopped answering, where ``e`` names one that gave up on it): those the launcher saw
    killed (``e.lost_with``); every rank of a lost host; and, on the named rank's host,
    those that died without a word (they had reached their first collective, and their
    record says neither failed, done, stopping nor rescued: a survivor says one of them,
    but a survivor on another host may be stopped by its daemon before it can)."""
    first = quiet if quiet is not None else e.rank
    lost = [first] if first is not None else []
    lost += list(getattr(e, "lost_with", []))
    if job is None or first is None:
        return list(dict.fromkeys(lost))
    host = _host_of(job, first, job.hosts)
    same = [r for r in range(job.nprocs) if _host_of(job, r, job.hosts) == host]
    if e.how.startswith("was lost with its host") and job.hosts is not None:
        return list(dict.fromkeys(lost + same))
    for r in same:
        rec = job.records.get(r)
        if rec is not None and rec.ready and rec.status == State.RUNNING and not rec.answered:
            lost.append(r)
    return list(dict.fromkeys(lost))


def _lost_at(job: Job | None, lost: list[int], quiet: int | None) -> float:
    """When the loss happened (unix time): a stalled rank's last heartbeat (its record's
    last write); else the first sign of it: the launcher seeing a rank end, or a
    survivor failing or being made to stop (gloo fails at once when a peer's connection
    closes; mpirun stops the others as it sees one die)."""
    now = time.time()
    if job is None:
        return now
    stalled = job.records.get(quiet) if quiet is not None else None
    if stalled is not None and stalled.updated:
        return min(now, stalled.updated)
    seen = [job.failed_at] if job.failed_at is not None else []
    for r, rec in job.records.items():
        if r not in lost:
            seen += [t for t in (rec.stopping_at, rec.time) if t]
    return min([now, *seen])


def _fails_the_try(e: RankFailure, reason: str) -> None:
    """End ``e``'s first sentence with why the elastic run gives up."""
    before = e.summary
    e.summary = f"{before}; {reason}: the try fails"
    message = str(e)
    rest = message[len(before) :] if message.startswith(before) else f"\n{message}"
    e.args = (e.summary + rest,)


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
    world = World.of(spec, d.ranks, cfg.parallel.stages)
    for host in _silent(spec, list(world.slots)):  # every try starts on the hosts that answer
        world.leave_out(host)
        say(f"dagtrain: host {host} does not answer: this try starts without it")
    changes: list[WorldChange] = []
    pending: WorldChange | None = None
    began: RankRecord | None = None  # the first world's rank 0 record: where the try began
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
            change: WorldChange | None = pending,
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
            pending = _after_loss(e, job, world, spec, n, len(changes), d, say)
            changes.append(pending)
            continue
        finally:
            stop.set()
            prober.join(timeout=PROBE_TIMEOUT + 1)
        _settle(timer, pending, on_change)
        pending = None
        began = began or _began(jobs[-1] if jobs else None)
        if result.stopped_for != "regrow":
            result.world_changes = [c.public() for c in changes]
            if changes and began:  # what this try did: from where its first world began
                result.resumed_from_step = began.start_step or None
                result.resumed_epochs = began.resumed_epochs or 0
            return result
        back = [h for h in world.waiting() if answers(spec, h, PROBE_TIMEOUT)]
        if not back:  # it answered the probe, not now: the same world again
            say("dagtrain: the host that answered does not now: going on as before")
            continue
        for h in back:
            world.take_back(h)
        pending = WorldChange(
            "grow",
            n,
            world.size,
            f"host {', '.join(back)} answers again",
            time.time(),
            step=result.steps,
            hosts=back,
            steps_lost=0,
        )
        changes.append(pending)
        say(f"dagtrain: {pending.why}: going on with {world.size} of {d.ranks} rank(s)")


def _after_loss(
    e: RankFailure,
    job: Job | None,
    world: World,
    spec: Hosts | None,
    n: int,
    made: int,
    d: DistributedConfig,
    say: Callable[[str], None],
) -> WorldChange:
    """The world change after ``e`` ended a world of ``n`` ranks (``made`` changes made
    already in this try): the lost ranks and hosts left out of ``world``, said in the
    task's log. ``e`` is raised again where it is no loss, where it would pass
    ``distributed.max_world_changes``, or where fewer than ``min_ranks`` would be left
    (the try fails, saying why)."""
    loss = is_loss(e, job)
    if not loss:
        raise e
    if made >= d.max_world_changes:
        say(
            f"dagtrain: {d.max_world_changes} world change(s) made already "
            "(distributed.max_world_changes): this loss fails the try"
        )
        _fails_the_try(
            e,
            f"{d.max_world_changes} world change(s) made already in this try "
            "(distributed.max_world_changes)",
        )
        raise e
    quiet = stalled_rank(job) if job is not None else None
    lost = lost_ranks(e, job, quiet)
    why = e.summary
    if quiet is not None and quiet != e.rank:  # e names a rank that gave up on it
        why = f"rank {quiet} stopped answering; {e.summary}"
    if len(lost) > 1:
        others = ", ".join(map(str, lost[1:]))
        why += f", and rank{'s' if len(lost) > 2 else ''} {others} with it"
    where = {r: _host_of(job, r, spec) for r in lost}
    # the job starts again on the hosts that answer: the lost ranks' hosts, and
    # any other that went with them; a slot on a host that answers is used
    # again at once, unless it already lost a rank in this try
    silent = _silent(spec, [h for h in world.slots if world.free(h)])
    if e.how.startswith("was lost with its host") and lost:
        silent = list(dict.fromkeys([where[lost[0]], *silent]))
    for h in silent:
        world.lose_host(h)
    dropped = [
        r
        for r in lost
        if where[r] not in silent and not world.lose_slot(where[r], _slot(job, r, spec))
    ]
    hosts_lost = list(dict.fromkeys([*(where[r] for r in lost), *silent]))
    change = WorldChange(
        "shrink" if world.size < n else "restart",
        n,
        world.size,
        why,
        _lost_at(job, lost, quiet),
        ranks=lost,
        hosts=hosts_lost,
        reached=_reached(job),
    )
    if world.size < d.fewest_ranks:  # no change of world: the try fails
        reason = f"{world.size} rank(s) left, fewer than distributed.min_ranks {d.fewest_ranks}"
        say(f"dagtrain: {why}; {reason}: the try fails")
        _fails_the_try(e, reason)
        raise e
    for other in silent:
        if other not in where.values():
            say(f"dagtrain: host {other} does not answer either: left out")
    left_out = [f"host {h}" for h in silent] + [
        f"rank {r}'s slot, lost twice in this try" for r in dropped
    ]
    again = "; its slot used again" if len(lost) == 1 else "; their slots used again"
    say(
        f"dagtrain: {why}"
        + (again if change.change == "restart" else "")
        + f"; going on with {world.size} of {d.ranks} rank(s)"
        + (f" ({', '.join(left_out)} left out)" if left_out else "")
    )
    return change


def _silent(spec: Hosts | None, hosts: list[str]) -> list[str]:
    """The hosts of ``hosts`` that do not answer a probe, probed side by side (this
    host answers at once)."""
    if spec is None:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(hosts))) as pool:
        answered = list(pool.map(lambda h: answers(spec, h, PROBE_TIMEOUT), hosts))
    return [h for h, ok in zip(hosts, answered) if not ok]


def _began(job: Job | None) -> RankRecord | None:
    """Rank 0's record of ``job`` once it started training (``start_step``,
    ``resumed_epochs``), else None."""
    rec = job.records.get(0) if job is not None else None
    return rec if rec is not None and rec.start_step is not None else None


def _reached(job: Job | None) -> int | None:
    """The most steps any rank of ``job`` had completed, as their records say."""
    if job is None:
        return None
    job.refresh()
    steps = [r.step for r in job.records.values() if isinstance(r.step, int)]
    return max(steps) if steps else None


def _probe_left_out(
    world: World, spec: Hosts | None, status_dir: Path, stop: threading.Event, grow: bool
) -> None:
    """While a world runs: probe the hosts of its left-out slots; when those that
    answer would make the world larger (a pipeline's: by a whole replica), ask the
    ranks to stop at their next epoch's end (``REGROW``)."""
    while grow and world.waiting() and not stop.wait(PROBE_EVERY):
        back = [h for h in world.waiting() if answers(spec, h, PROBE_TIMEOUT)]
        if back and world.grows_with(back):
            (status_dir / REGROW).write_text("a left-out host answers again\n")
            return


def _time_recovery(
    job: Job,
    change: WorldChange,
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
        rec = job.records.get(0)
        if rec is not None and rec.first_step_time is not None and rec.start_step is not None:
            change.step = rec.start_step
            change.seconds = round(rec.first_step_time - change.time, 3)
            if change.reached is not None and change.change != "grow":
                change.steps_lost = max(0, change.reached + 1 - change.step)
            break
        if ended:
            break
        time.sleep(0.05)
    if on_change is not None:
        on_change(change.public())
    change.told = True


def _settle(
    timer: threading.Thread | None,
    change: WorldChange | None,
    on_change: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Wait for the timing of ``change``; tell it untimed if no timer ran (the world
    failed before it started)."""
    if timer is not None:
        timer.join(timeout=FIRST_STEP_WAIT)
    elif change is not None and not change.told and on_change is not None:
        on_change(change.public())
        change.told = True
