"""Start N ranks, watch them, fail fast.

Launchers (argv lists only, never a shell string):

- ``mpirun``   Open MPI 5: ``mpirun --bind-to none --oversubscribe --output tag
               --mca mpi_yield_when_idle 1 -np N python -m mpi4py -m ...`` (``horovodrun --mpi``
               emits options Open MPI 5 rejects, so Horovod's MPI mode goes through
               mpirun too). Hosts: ``--host a:2,b:2``.
- ``horovodrun`` ``horovodrun --gloo -np N [-H a:2,b:2] python -m ...``.
- ``torchrun`` ``torchrun --nnodes 1 --nproc-per-node N --max-restarts 0 -m ...``.
               Hosts: one torchrun per host (``--nnodes H``, that host's slots as
               ``--nproc-per-node``), all meeting at a c10d (TCP) rendezvous on the first
               host; a host that is not this one gets its torchrun through the rsh agent.
- ``direct``   N processes started here with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
               ``MASTER_PORT`` (torch.distributed's env:// rendezvous; one host).

Several hosts (:class:`~dagtrain.launch.hosts.Hosts`): mpirun reaches the others
through ``--mca plm_rsh_agent`` (ssh unless the host list names another agent) and
starts its daemons there; torchrun's remote nodes are started as ``AGENT HOST python
-m dagtrain.launch.remote ... torchrun ...``, the words quoted for the remote shell as
ssh requires. ``dagtrain.launch.remote`` kills its torchrun (and so the ranks) when the
agent's connection closes (stdin at EOF) or it is signalled, so a remote node never
outlives the launcher, whatever ends it: the agent's stdin is a pipe that closes when
this process dies. When a host is lost (its daemon or node stopped answering), the
failure names the rank that ran there and the host.

Every child runs in a process group of its own; each line it prints is prefixed with
its rank and kept (the last lines per rank). When any rank exits non-zero or is
killed, the others are stopped (SIGTERM, then SIGKILL after ``grace`` seconds) and
:class:`RankFailure` names the first rank that failed, its exit code or signal, and
its last log lines. Killing the launcher (SIGTERM/SIGINT, or ``on_kill``) kills every
rank: no orphan survives.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from dagtrain.config import Launcher
from dagtrain.errors import InputError
from dagtrain.rank_env import (
    ERROR_DIR,
    FIRST_COLLECTIVE,
    ON_HOST,
    parent_death_signal,
    read_failures,
)

from .hosts import Hosts, is_local

__all__ = [
    "LAUNCHERS",
    "Job",
    "RankFailure",
    "RankInputError",
    "build_argv",
    "launch",
    "node_argvs",
]

LAUNCHERS: tuple[str, ...] = get_args(Launcher)
_TAIL = 30
# how long torchrun's nodes wait for each other at the rendezvous (a node that never
# comes is usually one whose agent failed, which the launcher sees sooner)
RDZV_JOIN_TIMEOUT = 120
# the exit code of ssh (and of the rsh agents that imitate it) when the connection to
# the host was lost or could not be made
_LOST = 255


class RankFailure(RuntimeError):
    """A rank exited non-zero or was killed; the job was stopped.

    ``how`` says how it ended (``exited with code 1``, ``was killed by SIGKILL``, ``was
    lost with its host: ...``); ``error`` is what the rank itself reported (its error's
    type and message), if it reported one; ``summary`` is the message's first sentence
    (``rank 1 on host b exited with code 1 (ValueError: ...)``)."""

    def __init__(
        self,
        rank: int | None,
        exit_code: int | None,
        signal_name: str | None,
        log_tail: Sequence[str],
        detail: str = "",
        how: str | None = None,
        host: str | None = None,
        error: str | None = None,
    ) -> None:
        if how is None:
            how = f"was killed by {signal_name}" if signal_name else f"exited with code {exit_code}"
        who = f"rank {rank}" if rank is not None else "a rank"
        if host:
            who += f" on host {host}"
        tail = "\n".join(f"    {line}" for line in log_tail[-12:]) or "    (no output)"
        self.summary = self._summary(who, how, detail, error)  # the first sentence
        super().__init__(self._message(self.summary, tail))
        self.rank = rank
        self.exit_code = exit_code
        self.signal = signal_name
        self.log_tail = list(log_tail)
        self.host = host
        self.how = how
        self.error = error

    @staticmethod
    def _summary(who: str, how: str, detail: str, error: str | None) -> str:
        return f"{who} {how}{detail}"

    @staticmethod
    def _message(summary: str, tail: str) -> str:
        return f"{summary}; the other ranks were stopped. Last lines of its log:\n{tail}"


class RankInputError(RankFailure, InputError):
    """A rank refused its input (``dagtrain.errors.InputError`` or ``MissingDependency``
    raised in the rank: a model's arguments, a factory it cannot import, a device it
    lacks, data it cannot read). Another try would meet the same input, so it is an
    InputError too: an Airflow task fails at once, without retries."""

    @staticmethod
    def _summary(who: str, how: str, detail: str, error: str | None) -> str:
        return f"{who} refused its input: {error}"

    @staticmethod
    def _message(summary: str, tail: str) -> str:
        return (
            f"{summary}; the other ranks were stopped (bad input: another try would fail "
            "the same way, so it is not retried)"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name  # the venv's own mpirun/torchrun/horovodrun
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(
            f"{name} is not installed in this environment "
            f"({sys.executable}); install the project's dependencies"
        )
    return found


def _forwarded(env: dict[str, str] | None) -> dict[str, str]:
    """What every rank gets, on any host: the job's own variables, the host list's
    ``env``, and PYTHONPATH/OMP_NUM_THREADS of this process."""
    out = {v: os.environ[v] for v in ("PYTHONPATH", "OMP_NUM_THREADS") if v in os.environ}
    return out | dict(env or {})


def build_argv(
    launcher: str,
    nprocs: int,
    module_args: Sequence[str],
    hosts: Hosts | Sequence[str] | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """The argv of the launcher process (not used for ``direct``, nor for torchrun on
    several hosts: see :func:`node_argvs`). ``env``: variables the ranks get on every
    host (mpirun ``-x``)."""
    py = sys.executable
    spec = Hosts.of(hosts)
    if launcher == "mpirun":
        argv = [
            _tool("mpirun"),
            "--bind-to",
            "none",
            "--oversubscribe",
            "--output",
            "tag",
            # a rank waiting in a collective yields its core to the rank's own compute
            # threads instead of spinning (ranks often share cores with backward)
            "--mca",
            "mpi_yield_when_idle",
            "1",
            "-np",
            str(nprocs),
        ]
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
        if spec is not None:
            argv += ["--host", ",".join(spec.entries)]
            if spec.rsh_agent:  # one string: Open MPI splits it on spaces itself
                argv += ["--mca", "plm_rsh_agent", " ".join(spec.rsh_agent)]
        for var, value in (_forwarded(env) | _spec_env(spec)).items():
            argv += ["-x", f"{var}={value}"]
        return [*argv, py, "-m", "mpi4py", "-m", *module_args]
    if launcher == "horovodrun":
        argv = [_tool("horovodrun"), "--gloo", "-np", str(nprocs)]
        if spec is not None:
            if spec.rsh_agent:
                raise InputError(
                    f"{spec.source}: horovodrun reaches other hosts through ssh only, not "
                    f"through the rsh agent {list(spec.rsh_agent)}; choose distributed."
                    "launcher mpirun (Horovod runs under mpirun too)"
                )
            argv += ["-H", ",".join(spec.entries)]
        return [*argv, py, "-m", *module_args]
    if launcher == "torchrun":
        if _nodes_apart(spec):
            raise InputError(
                "torchrun on other hosts starts one torchrun per host: use "
                "node_argvs(), or launch(), which does"
            )
        argv = [
            _tool("torchrun"),
            "--nproc-per-node",
            str(nprocs),
            "--max-restarts",
            "0",
            "--tee",
            "3",
            "--nnodes",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}",
        ]
        return [*argv, "-m", *module_args]
    raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")


def _nodes_apart(spec: Hosts | None) -> bool:
    """Whether torchrun needs a node per host: several hosts, or one that is not this."""
    return spec is not None and (len(spec.entries) > 1 or not is_local(spec.names[0]))


def _spec_env(spec: Hosts | None) -> dict[str, str]:
    return dict(spec.env) if spec is not None else {}


def node_argvs(
    nprocs: int,
    module_args: Sequence[str],
    hosts: Hosts | Sequence[str],
    env: dict[str, str] | None = None,
    rdzv_id: str | None = None,
) -> list[tuple[str, list[str], bool]]:
    """torchrun on several hosts: ``(host, argv, remote)`` for each host, one torchrun
    per host, each with that host's slots as its ranks, meeting at a c10d rendezvous
    on the first host (``rdzv_port``). A remote host's argv goes through the rsh agent
    and ``dagtrain.launch.remote``; its words are quoted for the remote shell, which an
    ssh-like agent hands them to (``shlex.quote``: the argv arrives as it is)."""
    import shlex

    spec = Hosts.of(hosts)
    if spec is None:
        raise ValueError("node_argvs needs a host list")
    if sum(spec.slots) != nprocs:
        raise InputError(
            f"{spec.source}: the hosts' slots add up to {sum(spec.slots)} but the job has "
            f"{nprocs} ranks; torchrun starts exactly the slots of each host: make them "
            "add up to distributed.ranks"
        )
    rdzv_id = rdzv_id or uuid.uuid4().hex[:16]
    endpoint = f"{spec.names[0]}:{spec.rdzv_port}"
    variables = _forwarded(env) | _spec_env(spec) | _TORCHRUN_ENV
    out = []
    for k, (host, slots) in enumerate(zip(spec.names, spec.slots)):
        torchrun = [
            _tool("torchrun"),
            "--nnodes",
            str(len(spec.entries)),
            "--nproc-per-node",
            str(slots),
            "--max-restarts",
            "0",
            "--tee",
            "3",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            rdzv_id,
            # the first host serves the rendezvous; say so rather than let torchrun
            # guess from host names (which a container or namespace may not resolve)
            "--rdzv-conf",
            f"is_host={'true' if k == 0 else 'false'},join_timeout={RDZV_JOIN_TIMEOUT}",
            # the address the others reach this node at: the host list's name for it
            "--local-addr",
            host.strip("[]"),
            "-m",
            *module_args,
        ]
        if is_local(host):
            out.append((host, torchrun, False))
            continue
        remote = [sys.executable, "-m", "dagtrain.launch.remote"]
        for var, value in variables.items():
            remote += ["--env", f"{var}={value}"]
        words = [*remote, "--", *torchrun]
        out.append((host, [*spec.agent(), host, *map(shlex.quote, words)], True))
    return out


# every torchrun prefixes each rank's lines with its global rank (its default is the
# local rank, which repeats on every host)
_TORCHRUN_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[default${rank}]:"}


# what the launchers print when a rank fails, to find which one did
_MPI_SIGNAL = re.compile(
    r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal "
    r"(\d+)",
    re.S,
)
_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+)")
_MPI_CALLED_ABORT = re.compile(
    r"process rank (\d+) with PID \d+ on node \S+ calling\s+\"abort\"", re.S
)
_MPI_EXIT = re.compile(r"Process name: \[\S+?,(\d+)\]\s+Exit code:\s+(\d+)", re.S)
_OURS = re.compile(r"dagtrain rank (\d+) failed(?: \[t=([\d.]+)\])?: (.*)")
# a rank that gave up waiting: ours (CollectiveTimeout), gloo's, NCCL's
_TIMED_OUT = re.compile(r"did not finish within|[Tt]imed out|[Tt]imeout")
_READY = re.compile(rf"dagtrain rank (\d+) {FIRST_COLLECTIVE}")
_TORCHRUN = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s+exitcode\s*:\s*(-?\d+)", re.S)
# how each launcher tags a rank's lines: mpirun --output tag, horovodrun, torchrun --tee
_TAGGED = re.compile(r"^\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>: ?(.*)$|^\[default(\d+)\]:(.*)$")
_ON_HOST = re.compile(rf"dagtrain rank (\d+) {ON_HOST} (\S+)")
# Open MPI (PRRTE) when a host's daemon is gone: it then exits 0, so this is the sign
_MPI_LOST = re.compile(r"Remote daemon:\s*\S+ on node (\S+)|^\s*Remote host:\s+(\S+)")


@dataclass
class Job:
    """Running ranks: the child processes and what they printed, by rank."""

    procs: list[subprocess.Popen]
    direct: bool
    tails: dict[int | None, collections.deque] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # untagged lines of a launcher
    # "dagtrain rank N failed [t=...]": (time, rank, what)
    failed: list[tuple[float, int, str]] = field(default_factory=list)
    ready: set[int] = field(default_factory=set)  # ranks that reached their first collective
    lock: threading.Lock = field(default_factory=threading.Lock)
    readers: list[threading.Thread] = field(default_factory=list)
    hosts: Hosts | None = None  # the host list of a job on several hosts
    placement: dict[int, str] = field(default_factory=dict)  # rank -> the host it reported
    node_hosts: list[str] = field(default_factory=list)  # torchrun: procs[k] serves this host
    node_of_rank: dict[int, int] = field(default_factory=dict)  # torchrun: rank -> procs[k]
    lost: list[str] = field(default_factory=list)  # hosts the launcher said it lost
    nprocs: int = 0
    error_dir: Path | None = None  # where the ranks write why they failed (rank_env)

    def host_of(self, rank: int | None) -> str | None:
        """The host ``rank`` ran on: the name it reported, and the host list's entry
        for it where that differs; None on one host or when unknown."""
        if rank is None or self.hosts is None:
            return None
        listed = None
        if rank in self.node_of_rank:
            listed = self.node_hosts[self.node_of_rank[rank]]
        elif not self.node_hosts:
            listed = self.hosts.placement(rank + 1)[rank]
        reported = self.placement.get(rank)
        if reported and listed and reported != listed:
            return f"{reported} ({listed})"
        return reported or listed

    def ranks_on(self, host: str) -> list[int]:
        """The ranks that ran on ``host`` (a reported name or a host list entry)."""
        found = {r for r, h in self.placement.items() if h == host}
        found |= {r for r, k in self.node_of_rank.items() if self.node_hosts[k] == host}
        if not found and self.hosts is not None and not self.node_hosts:
            found = {r for r, h in enumerate(self.hosts.placement(self.nprocs)) if h == host}
        return sorted(found)

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
                time.sleep(0.05)
        for p in self.procs:  # reap the group leaders' children too (mpirun's ranks)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)


def _reader(
    job: Job,
    stream,
    rank: int | None,
    on_line: Callable[[str], None],
    node: int | None = None,
) -> None:
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        r = rank
        m = _TAGGED.match(line) if rank is None else None
        if m:
            r = int(m.group(1) if m.group(1) is not None else m.group(3))
            line = m.group(2) if m.group(1) is not None else m.group(4)
        with job.lock:
            job.tails.setdefault(r, collections.deque(maxlen=_TAIL)).append(line)
            if r is None:
                job.lines.append(line)
                del job.lines[:-400]
                if (m := _MPI_LOST.search(line)) is not None:
                    job.lost.append(m.group(1) or m.group(2))
            elif node is not None:
                job.node_of_rank[r] = node
            m = _OURS.search(line)
            if m:  # kept apart: a long traceback after it must not push it out
                job.failed.append((float(m.group(2) or "inf"), int(m.group(1)), m.group(3)))
            elif (m := _READY.search(line)) is not None:
                job.ready.add(int(m.group(1)))
            elif (m := _ON_HOST.search(line)) is not None:
                job.placement[int(m.group(1))] = m.group(2)
        on_line(f"[rank {r}] {line}" if r is not None else line)
    stream.close()


def _signal_name(code: int) -> str | None:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return signal.Signals(code - 128).name
    return None


def _lost_host(job: Job, codes: Sequence[int | None]) -> tuple[str, str] | None:
    """(host, why) of a host that was lost, if one was: Open MPI said it lost the
    daemon there, or the rsh agent of a torchrun node ended as ssh does when its
    connection fails (255) or was killed."""
    with job.lock:
        if job.lost:
            return job.lost[0], (
                "Open MPI lost its daemon there: the host died, or the network to it failed"
            )
    for k, c in enumerate(codes):
        if k < len(job.node_hosts) and c is not None and (c == _LOST or c < 0):
            how = f"with code {c}" if c >= 0 else f"by {_signal_name(c)}"
            return job.node_hosts[k], (
                f"the connection to its torchrun ended (the rsh agent exited {how}): the "
                "host died, or the network to it failed"
            )
    return None


def _diagnose(
    job: Job,
    first: tuple[int, int] | None,
    nprocs: int,
    codes: Sequence[int | None] = (),
) -> RankFailure:
    """Which rank failed first, and how, from exit codes and what the launcher printed."""
    lost = _lost_host(job, codes)
    if lost is not None:
        host, why = lost
        ranks = job.ranks_on(host)
        rank = ranks[0] if ranks else None
        with job.lock:
            tail = list(job.tails.get(rank) or job.lines[-_TAIL:])
        others = f" (ranks {', '.join(map(str, ranks))} ran there)" if len(ranks) > 1 else ""
        return RankFailure(
            rank,
            None,
            None,
            tail,
            others,
            how=f"was lost with its host: {why}",
            host=job.host_of(rank) or host,
        )
    # what the ranks reported themselves: their files, and (a rank whose file this host
    # cannot see) their last words on stderr; the earliest failure is the cause
    records = {r["rank"]: r for r in read_failures(job.error_dir)}
    with job.lock:
        text = "\n".join([*job.lines, *(line for t in job.tails.values() for line in t)])
        ours = sorted(
            [f for f in job.failed if f[1] not in records]
            + [(float(r["time"]), k, f"{r['type']}: {r['message']}") for k, r in records.items()],
            key=lambda f: f[0],
        )
    rank: int | None = None
    code: int | None = None
    sig: str | None = None
    detail = ""
    if first is not None and job.direct:
        rank, code = first
        sig = _signal_name(code)
        if sig is None and ours and ours[0][1] != rank:
            # both exited non-zero before we looked: the one that failed first is the
            # cause, the other failed because of it
            rank, detail = ours[0][1], f" ({ours[0][2]})"
            code = job.procs[rank].poll() or 1
        elif sig is None and ours:
            detail = f" ({ours[0][2]})"
    else:
        if first is not None:
            code = first[1]
        m = _MPI_SIGNAL.search(text)
        if m:
            rank, sig = int(m.group(1)), signal.Signals(int(m.group(2))).name
        elif ours:
            rank, detail = ours[0][1], f" ({ours[0][2]})"
            code = 1
        elif (m := _MPI_CALLED_ABORT.search(text)) is not None or (
            m := _MPI_ABORT.search(text)
        ) is not None:
            rank = int(m.group(1))
        elif (m := _MPI_EXIT.search(text)) is not None:
            rank, code = int(m.group(1)), int(m.group(2))
        elif (m := _TORCHRUN.search(text.rpartition("Root Cause")[2])) is not None:
            rank, code = int(m.group(1)), int(m.group(2))
            sig = _signal_name(code)
        elif code is not None:
            sig = _signal_name(code)
    if sig:
        code = None
    how = None
    with job.lock:
        reported = {f[1] for f in ours}  # a rank that said why it failed is not missing
        missing = sorted(set(range(nprocs)) - job.ready - reported) if job.ready else []
        timed_out = any(_TIMED_OUT.search(f[2]) for f in ours)
    if missing and timed_out:
        # the rank that gave up waiting is not the cause: the one that never arrived is
        waited, rank, code, sig = rank, missing[0], None, None
        how = "never reached its first collective (it hung, was stopped, or is too slow)"
        detail = f"; rank {waited} gave up waiting for it{detail}"
    with job.lock:
        # the rank's own last lines; the launcher's only when the rank printed none
        tail = list(job.tails.get(rank) or job.lines[-_TAIL:])
    record = records.get(rank) if rank is not None else None
    kind = RankInputError if record is not None and record.get("fail_fast") else RankFailure
    error = f"{record['type']}: {record['message']}" if record is not None else None
    return kind(rank, code, sig, tail, detail, how, host=job.host_of(rank), error=error)


def launch(
    module_args: Sequence[str],
    nprocs: int,
    launcher: str = "direct",
    hosts: Hosts | Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
    grace: float = 5.0,
    on_start: Callable[[Job], None] | None = None,
    error_dir: str | Path | None = None,
) -> Job:
    """Run ``python -m <module_args>`` on ``nprocs`` ranks; return the Job when all
    exit 0 (``job.placement``: the host each rank reported).

    ``error_dir``: where a failing rank writes why (``dagtrain.rank_env``); ranks on
    other hosts need it on storage they share (default: a temporary folder here,
    removed when the job ends).

    ``hosts``: a host list (``host:slots`` entries, or a Hosts with its rsh agent and
    environment) for ranks on several machines. Raises RankFailure when a rank fails
    (RankInputError, an InputError too, when it refused its input) or a host is lost
    (the others are stopped within ``grace`` + 5 s), TimeoutError after ``timeout``
    seconds (every rank killed), InputError for a host list the launcher cannot use.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, not {nprocs}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    spec = Hosts.of(hosts)
    if launcher == "direct" and spec is not None:
        elsewhere = [h for h in spec.names if not is_local(h)]
        if elsewhere:
            raise InputError(
                f"{spec.source}: launcher direct starts every rank on this host, but the "
                f"host list names {', '.join(elsewhere)}; choose distributed.launcher "
                "mpirun or torchrun to run ranks on other hosts"
            )
        spec = None
    own_errors = error_dir is None
    error_dir = Path(tempfile.mkdtemp(prefix="dagtrain-errors-") if own_errors else error_dir)
    error_dir.mkdir(parents=True, exist_ok=True)
    env = {**(env or {}), ERROR_DIR: str(error_dir)}  # every rank, on every host
    nodes = (
        node_argvs(nprocs, module_args, spec, env)
        if launcher == "torchrun" and _nodes_apart(spec)
        else None
    )
    on_line = on_line or (lambda line: print(line, file=sys.stderr, flush=True))
    base = {**os.environ, **_spec_env(spec), **(env or {}), "PYTHONUNBUFFERED": "1"}
    orphan_guard = parent_death_signal(signal.SIGTERM)
    procs: list[subprocess.Popen] = []
    job = Job(procs, direct=launcher == "direct", hosts=spec, nprocs=nprocs, error_dir=error_dir)

    def spawn(
        argv: list[str],
        extra: dict[str, str],
        rank: int | None,
        node: int | None = None,
        remote: bool = False,
    ) -> None:
        p = subprocess.Popen(
            argv,
            env={**base, **extra},
            # a remote node watches its input: it stops its ranks when the pipe closes,
            # which it does when this process dies, however it dies
            stdin=subprocess.PIPE if remote else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            # SIGKILL of this process (OOM killer, Airflow's supervisor) must not leave
            # mpirun/torchrun or a rank running: each child gets SIGTERM when we die,
            # and every rank arranges its own SIGKILL for when its parent dies
            preexec_fn=orphan_guard,  # noqa: PLW1509 (a bare prctl, resolved before)
        )
        procs.append(p)
        for stream in (p.stdout, p.stderr):
            t = threading.Thread(
                target=_reader, args=(job, stream, rank, on_line, node), daemon=True
            )
            t.start()
            job.readers.append(t)

    previous: dict[int, Any] = {}

    def stopped(signum: int, frame: Any) -> None:
        # whoever handled the signal before runs first: inside an Airflow task that is
        # the task runner's, which calls the operator's on_kill (it kills this job)
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)
        raise KeyboardInterrupt(f"launcher got {signal.Signals(signum).name}")

    session: dict[str, str] | None = None
    try:
        # a launcher killed by SIGTERM must take its ranks along
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if threading.current_thread() is threading.main_thread():
                previous[sig] = signal.signal(sig, stopped)
        if launcher == "direct":
            port = str(_free_port())
            for r in range(nprocs):
                spawn(
                    [sys.executable, "-m", *module_args],
                    {
                        "RANK": str(r),
                        "LOCAL_RANK": str(r),
                        "WORLD_SIZE": str(nprocs),
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port,
                    },
                    r,
                )
        elif nodes is not None:
            job.node_hosts = [host for host, _, _ in nodes]
            for k, (_, argv, remote) in enumerate(nodes):
                spawn(argv, _TORCHRUN_ENV, None, node=k, remote=remote)
        else:
            extra = _TORCHRUN_ENV if launcher == "torchrun" else {}
            if launcher == "mpirun":
                # its session directory (named by its pid) inside one of this job's own:
                # one that a SIGKILLed mpirun left in /tmp stops the next mpirun given
                # that pid ("The PMIx server's listener thread failed to start")
                session = extra = {"TMPDIR": tempfile.mkdtemp(prefix="dagtrain-mpirun-")}
            spawn(build_argv(launcher, nprocs, module_args, spec, env), extra, None)
        if on_start is not None:
            on_start(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        first: tuple[int, int] | None = None
        while True:
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c not in (None, 0) and first is None:
                    first = (r, c)
            if first is not None:
                # the others' own ends say more than those we cause: a node whose host
                # was lost ends a moment after the rank that lost its peer there
                settle = time.monotonic() + 1.0
                while time.monotonic() < settle and any(p.poll() is None for p in procs):
                    time.sleep(0.05)
                codes = [p.poll() for p in procs]
                job.kill(grace)
                for t in job.readers:
                    t.join(timeout=2)
                raise _diagnose(job, first, nprocs, codes)
            if all(c == 0 for c in codes):
                for t in job.readers:
                    t.join(timeout=2)
                if job.lost:  # Open MPI exits 0 when it loses a host's daemon
                    job.kill(grace)
                    raise _diagnose(job, None, nprocs, codes)
                return job
            if deadline is not None and time.monotonic() > deadline:
                job.kill(grace)
                raise TimeoutError(
                    f"the {nprocs} ranks did not finish within {timeout:g} s; every rank was killed"
                )
            time.sleep(0.05)
    except BaseException:
        job.kill(grace)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if session is not None:  # (its ranks are gone: the job ended or was killed)
            shutil.rmtree(session["TMPDIR"], ignore_errors=True)
        if own_errors:
            shutil.rmtree(error_dir, ignore_errors=True)
