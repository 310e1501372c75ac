"""Supervising a job's processes: start them, read what they print, watch their ends
and their status records, stop them, and leave nothing behind.

Every child runs in a process group of its own and gets SIGTERM from the kernel when
this process dies, however it dies (``PR_SET_PDEATHSIG``); each line it prints is
prefixed with its rank and kept (the last lines per rank). When any process exits
non-zero or is killed, :func:`watch` stops the others (SIGTERM, then SIGKILL after
``grace`` seconds) and returns the :class:`Ending` for ``diagnose`` to name. Once
every rank's record says it is done, the processes get ``EXIT_WAIT`` seconds to exit;
one that has not by then (stopped, or hung in a library's teardown waiting for a peer
that is) is stopped, and the job has succeeded. A remote
torchrun node gets a pipe as its input, closed when the job is stopped or this
process dies: its far end (``dagtrain.launch.remote``) then stops the node.

The ranks' status records (``dagtrain.rank_env``) are read every
``RECORDS_EVERY`` seconds while the job runs, and once more after it ended:
``Job.placement`` (the host each rank runs on) and ``Job.ready`` (the ranks that
reached their first collective) come from them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagtrain.rank_env import parent_death_signal
from dagtrain.records.status import RankRecord, read_records

from .hosts import Hosts

__all__ = [
    "RECORDS_EVERY",
    "TAIL",
    "Ending",
    "Job",
    "mpirun_session",
    "reader",
    "spawn",
    "status_folder",
    "stop_on_signals",
    "watch",
]

TAIL = 30  # lines kept per rank
RECORDS_EVERY = 0.25  # seconds between two reads of the status records
POLL = 0.05  # seconds between two looks at the processes
SETTLE = 1.0  # seconds the others get to end by themselves once one has failed
EXIT_WAIT = 15.0  # seconds the processes get to exit once every rank's record says done

# how each launcher tags a rank's lines: mpirun --output tag, horovodrun, torchrun --tee
_TAGGED = re.compile(r"^\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>: ?(.*)$|^\[default(\d+)\]:(.*)$")
# Open MPI (PRRTE) when a host's daemon is gone: it then exits 0, so this is the sign
_MPI_LOST = re.compile(r"Remote daemon:\s*\S+ on node (\S+)|^\s*Remote host:\s+(\S+)")


@dataclass
class Job:
    """Running ranks: the child processes, what they printed by rank, and what their
    status records say."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    direct: bool = False  # procs[r] is rank r
    tails: dict[int | None, collections.deque] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # untagged lines of a launcher
    lock: threading.Lock = field(default_factory=threading.Lock)
    readers: list[threading.Thread] = field(default_factory=list)
    hosts: Hosts | None = None  # the host list of a job on several hosts
    node_hosts: list[str] = field(default_factory=list)  # torchrun: procs[k] serves this host
    node_of_rank: dict[int, int] = field(default_factory=dict)  # torchrun: rank -> procs[k]
    lost: list[str] = field(default_factory=list)  # hosts the launcher said it lost
    nprocs: int = 0
    status_dir: Path | None = None  # where the ranks keep their status records
    job_id: str | None = None  # written into this job's records (rank_env.JOB_ID)
    records: dict[int, RankRecord] = field(default_factory=dict)  # rank -> its status record
    placement: dict[int, str] = field(default_factory=dict)  # rank -> the host it reported
    ready: set[int] = field(default_factory=set)  # ranks that reached their first collective
    failed_at: float | None = None  # when a process was first seen ended non-zero (unix)

    def refresh(self) -> None:
        """Read this job's status records again (``records``, ``placement``, ``ready``)."""
        records = read_records(self.status_dir, self.job_id)
        self.records = records
        self.placement.update({r: rec.host for r, rec in records.items() if rec.host})
        self.ready.update(r for r, rec in records.items() if rec.ready)

    def done(self) -> bool:
        """Whether every rank's record (of this job) says it is done."""
        recs = self.records
        return len(recs) == self.nprocs and all(r.done for r in recs.values())

    def kill(self, grace: float = 5.0) -> None:
        """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds.
        First the pipes to the rsh agents are closed: a remote node stops its ranks
        when its input ends."""
        for p in self.procs:
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(POLL)
        for p in self.procs:  # reap the group leaders' children too (mpirun's ranks)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def join_readers(self) -> None:
        for t in self.readers:
            t.join(timeout=2)


@dataclass
class Ending:
    """How a job that did not succeed ended: ``failed``, the ``(index in procs, exit
    code)`` of each process seen ended non-zero first (all seen at the same look);
    ``codes``, every process's exit code a moment later, before the others were
    stopped (None: still running then). No ``failed``: a host was lost while every
    process exited 0 (Open MPI does so)."""

    failed: list[tuple[int, int]]
    codes: list[int | None]


def reader(
    job: Job,
    stream: Any,
    rank: int | None,
    on_line: Callable[[str], None],
    node: int | None = None,
) -> None:
    """Read ``stream`` to its end: every line kept in the tail of its rank (from the
    launcher's tag when ``rank`` is None) and passed to ``on_line`` as ``[rank N] ...``."""
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        r = rank
        m = _TAGGED.match(line) if rank is None else None
        if m:
            r = int(m.group(1) if m.group(1) is not None else m.group(3))
            line = m.group(2) if m.group(1) is not None else m.group(4)
        with job.lock:
            job.tails.setdefault(r, collections.deque(maxlen=TAIL)).append(line)
            if r is None:
                job.lines.append(line)
                del job.lines[:-400]
                if (m := _MPI_LOST.search(line)) is not None:
                    job.lost.append(m.group(1) or m.group(2))
            elif node is not None:
                job.node_of_rank[r] = node
        on_line(f"[rank {r}] {line}" if r is not None else line)
    stream.close()


@functools.cache
def _orphan_guard(sig: int) -> Callable[[], None]:
    return parent_death_signal(sig)


def spawn(
    job: Job,
    argv: list[str],
    env: dict[str, str],
    on_line: Callable[[str], None],
    rank: int | None = None,
    node: int | None = None,
    remote: str | None = None,
    orphan_signal: int = signal.SIGTERM,
) -> None:
    """Start ``argv`` as one of ``job``'s processes (``rank``: the rank it is, for the
    direct launcher; ``node``: the torchrun node it is), with a reader per stream.
    ``remote``: a remote node's first line of input (its variables, as JSON).
    ``orphan_signal``: what the process gets when this one dies."""
    p = subprocess.Popen(
        argv,
        env=env,
        # a remote node watches its input: it stops its ranks when the pipe closes,
        # which it does when this process dies, however it dies
        stdin=subprocess.PIPE if remote is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # SIGKILL of this process (OOM killer, Airflow's supervisor) must not leave
        # mpirun/torchrun or a rank running: each child gets orphan_signal when we die,
        # and every rank arranges its own SIGKILL for when its parent dies
        preexec_fn=_orphan_guard(orphan_signal),  # noqa: PLW1509 (a bare prctl)
    )
    job.procs.append(p)
    if remote is not None and p.stdin is not None:
        with contextlib.suppress(BrokenPipeError):  # an agent that failed: watch says so
            p.stdin.write(remote)
            p.stdin.flush()  # and kept open: its EOF is this process's end
    for stream in (p.stdout, p.stderr):
        t = threading.Thread(target=reader, args=(job, stream, rank, on_line, node), daemon=True)
        t.start()
        job.readers.append(t)


def watch(job: Job, timeout: float | None, grace: float) -> Ending | None:
    """Wait for the job to end. None when every process exited 0; else the Ending, with
    every process stopped and its records read. TimeoutError after ``timeout`` seconds
    (every process killed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    next_read = 0.0
    done_at: float | None = None  # when every rank's record first said done
    while True:
        codes = [p.poll() for p in job.procs]
        failed = [(k, c) for k, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            job.failed_at = time.time()
            return _stop_after(job, failed, grace)
        if all(c == 0 for c in codes):
            job.join_readers()
            job.refresh()
            if job.lost:  # Open MPI exits 0 when it loses a host's daemon
                job.kill(grace)
                return Ending([], codes)
            return None
        if deadline is not None and time.monotonic() > deadline:
            job.kill(grace)
            raise TimeoutError(
                f"the {job.nprocs} ranks did not finish within {timeout:g} s; every rank was killed"
            )
        if time.monotonic() >= next_read:
            job.refresh()
            next_read = time.monotonic() + RECORDS_EVERY
            if done_at is None and job.done():
                done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > EXIT_WAIT:
            # every rank said it is done, and one still has not exited (stopped, or hung
            # in its library's teardown waiting for a peer that is): the work is over
            job.kill(grace)
            job.join_readers()
            return None
        time.sleep(POLL)


def _stop_after(job: Job, failed: list[tuple[int, int]], grace: float) -> Ending:
    """Stop the job after ``failed`` ended: the others' own ends say more than those we
    cause (a node whose host was lost ends a moment after the rank that lost its peer
    there), so they get ``SETTLE`` seconds first."""
    settle = time.monotonic() + SETTLE
    while time.monotonic() < settle and any(p.poll() is None for p in job.procs):
        time.sleep(POLL)
    codes = [p.poll() for p in job.procs]
    job.kill(grace)
    job.join_readers()
    job.refresh()
    return Ending(failed, codes)


@contextlib.contextmanager
def status_folder(given: str | Path | None) -> Iterator[Path]:
    """The job's status folder: ``given`` (created if need be, kept), else a temporary
    one removed when the job ends."""
    if given is not None:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    folder = Path(tempfile.mkdtemp(prefix="dagtrain-status-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def mpirun_session(wanted: bool) -> Iterator[dict[str, str]]:
    """The variables that put mpirun's session directory (named by its pid) inside one
    of this job's own, removed when the job ends: one that a SIGKILLed mpirun left in
    /tmp stops the next mpirun given that pid ("The PMIx server's listener thread failed
    to start"). Nothing when not ``wanted``."""
    if not wanted:
        yield {}
        return
    folder = tempfile.mkdtemp(prefix="dagtrain-mpirun-")
    try:
        yield {"TMPDIR": folder}
    finally:  # (its ranks are gone: the job ended or was killed)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the job runs, SIGTERM and SIGHUP raise KeyboardInterrupt here (after the
    handler they replace has run: inside an Airflow task, the task runner's, which calls
    the operator's on_kill), so that a launcher killed so takes its ranks along. Only in
    the main thread, where signal handlers live."""
    previous: dict[int, Any] = {}

    def stopped(signum: int, frame: Any) -> None:
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)
        raise KeyboardInterrupt(f"launcher got {signal.Signals(signum).name}")

    try:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, stopped)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
