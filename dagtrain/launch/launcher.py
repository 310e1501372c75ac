"""Start N ranks, watch them, fail fast.

Launchers (argv lists only, never a shell string):

- ``mpirun``   Open MPI 5: ``mpirun --bind-to none --oversubscribe --output tag
               --mca mpi_yield_when_idle 1 -np N python -m mpi4py -m ...`` (``horovodrun --mpi``
               emits options Open MPI 5 rejects, so Horovod's MPI mode goes through
               mpirun too). Hosts: ``--host a:2,b:2``.
- ``horovodrun`` ``horovodrun --gloo -np N [-H a:2,b:2] python -m ...``.
- ``torchrun`` ``torchrun --nnodes 1 --nproc-per-node N --max-restarts 0 -m ...``.
- ``direct``   N processes started here with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
               ``MASTER_PORT`` (torch.distributed's env:// rendezvous; one host).

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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from dagtrain.config import Launcher
from dagtrain.errors import InputError
from dagtrain.rank_env import FIRST_COLLECTIVE, parent_death_signal

__all__ = ["LAUNCHERS", "Job", "RankFailure", "build_argv", "launch"]

LAUNCHERS: tuple[str, ...] = get_args(Launcher)
_TAIL = 30


class RankFailure(RuntimeError):
    """A rank exited non-zero or was killed; the job was stopped."""

    def __init__(
        self,
        rank: int | None,
        exit_code: int | None,
        signal_name: str | None,
        log_tail: Sequence[str],
        detail: str = "",
        how: str | None = None,
    ) -> None:
        if how is None:
            how = f"was killed by {signal_name}" if signal_name else f"exited with code {exit_code}"
        who = f"rank {rank}" if rank is not None else "a rank"
        tail = "\n".join(f"    {line}" for line in log_tail[-12:]) or "    (no output)"
        super().__init__(
            f"{who} {how}{detail}; the other ranks were stopped. Last lines of its log:\n{tail}"
        )
        self.rank = rank
        self.exit_code = exit_code
        self.signal = signal_name
        self.log_tail = list(log_tail)


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


def build_argv(
    launcher: str, nprocs: int, module_args: Sequence[str], hosts: Sequence[str] | None = None
) -> list[str]:
    """The argv of the launcher process (not used for ``direct``)."""
    py = sys.executable
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
        if hosts:
            argv += ["--host", ",".join(hosts)]
        for var in ("PYTHONPATH", "OMP_NUM_THREADS"):
            if var in os.environ:
                argv += ["-x", var]
        return [*argv, py, "-m", "mpi4py", "-m", *module_args]
    if launcher == "horovodrun":
        argv = [_tool("horovodrun"), "--gloo", "-np", str(nprocs)]
        if hosts:
            argv += ["-H", ",".join(hosts)]
        return [*argv, py, "-m", *module_args]
    if launcher == "torchrun":
        argv = [
            _tool("torchrun"),
            "--nproc-per-node",
            str(nprocs),
            "--max-restarts",
            "0",
            "--tee",
            "3",
        ]
        if hosts:
            raise InputError(
                "torchrun over several hosts needs a rendezvous endpoint: start "
                "it on each host yourself, or use mpirun"
            )
        argv += [
            "--nnodes",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}",
        ]
        return [*argv, "-m", *module_args]
    raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")


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

    def kill(self, grace: float = 5.0) -> None:
        """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds."""
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


def _reader(job: Job, stream, rank: int | None, on_line: Callable[[str], None]) -> None:
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
            m = _OURS.search(line)
            if m:  # kept apart: a long traceback after it must not push it out
                job.failed.append((float(m.group(2) or "inf"), int(m.group(1)), m.group(3)))
            elif (m := _READY.search(line)) is not None:
                job.ready.add(int(m.group(1)))
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


def _diagnose(job: Job, first: tuple[int, int] | None, nprocs: int) -> RankFailure:
    """Which rank failed first, and how, from exit codes and what the launcher printed."""
    with job.lock:
        text = "\n".join([*job.lines, *(line for t in job.tails.values() for line in t)])
        ours = sorted(job.failed, key=lambda f: f[0])  # the earliest failure is the cause
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
    return RankFailure(rank, code, sig, tail, detail, how)


def launch(
    module_args: Sequence[str],
    nprocs: int,
    launcher: str = "direct",
    hosts: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
    grace: float = 5.0,
    on_start: Callable[[Job], None] | None = None,
) -> None:
    """Run ``python -m <module_args>`` on ``nprocs`` ranks; return when all exit 0.

    Raises RankFailure when a rank fails (the others are stopped within ``grace`` +
    5 s), TimeoutError after ``timeout`` seconds (every rank killed).
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, not {nprocs}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    on_line = on_line or (lambda line: print(line, file=sys.stderr, flush=True))
    base = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    orphan_guard = parent_death_signal(signal.SIGTERM)
    procs: list[subprocess.Popen] = []
    job = Job(procs, direct=launcher == "direct")

    def spawn(argv: list[str], extra: dict[str, str], rank: int | None) -> None:
        p = subprocess.Popen(
            argv,
            env={**base, **extra},
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
            t = threading.Thread(target=_reader, args=(job, stream, rank, on_line), daemon=True)
            t.start()
            job.readers.append(t)

    previous = {}
    try:
        # a launcher killed by SIGTERM must take its ranks along
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if threading.current_thread() is threading.main_thread():
                previous[sig] = signal.signal(
                    sig,
                    lambda s, f: (_ for _ in ()).throw(
                        KeyboardInterrupt(f"launcher got {signal.Signals(s).name}")
                    ),
                )
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
        else:
            spawn(build_argv(launcher, nprocs, module_args, hosts), {}, None)
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
                job.kill(grace)
                for t in job.readers:
                    t.join(timeout=2)
                raise _diagnose(job, first, nprocs)
            if all(c == 0 for c in codes):
                for t in job.readers:
                    t.join(timeout=2)
                return
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
