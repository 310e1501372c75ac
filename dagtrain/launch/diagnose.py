"""Why a job failed: which rank failed first, on which host, and how.

What the ranks wrote decides first: each rank's status record (``dagtrain.rank_env``:
its host, whether it reached its first collective, its step, and, when it failed, its
error's type and message, traceback and whether another try would fail the same way).
What leaves no record is known from the processes' ends and the launchers' own words
about the ranks they saw die:

- a rank killed by a signal: its exit status (the direct launcher), mpirun's "process
  rank N ... exited on signal S", torchrun's "Root Cause" block;
- a rank that aborted: mpirun's "MPI_ABORT was invoked on rank N", its exit codes;
- a lost host: Open MPI's lost remote daemon (it then exits 0), the rsh agent of a
  torchrun node ending as ssh does when its connection fails (255) or killed.

The ranks' own stderr is only shown (``last_lines``), never read for a cause.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

from dagtrain.errors import InputError
from dagtrain.records.status import RankRecord

from .supervise import TAIL, Ending, Job

__all__ = [
    "STALLED",
    "PEER_GONE",
    "TIMED_OUT",
    "RankFailure",
    "RankInputError",
    "diagnose",
    "host_of",
    "ranks_on",
    "signal_name",
    "stalled_rank",
]

# the exit code of ssh (and of the rsh agents that imitate it) when the connection to
# the host was lost or could not be made
_LOST = 255

# what the launchers print when a rank fails, to find which one did
_MPI_SIGNAL = re.compile(
    r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)", re.S
)
_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+)")
_MPI_CALLED_ABORT = re.compile(
    r"process rank (\d+) with PID \d+ on node \S+ calling\s+\"abort\"", re.S
)
_MPI_EXIT = re.compile(r"Process name: \[\S+?,(\d+)\]\s+Exit code:\s+(\d+)", re.S)
_TORCHRUN = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s+exitcode\s*:\s*(-?\d+)", re.S)
# how a rank the others waited for at their first collective is said to have ended
STALLED = "never reached its first collective"
# a rank that gave up waiting (its recorded error): ours (CollectiveTimeout), gloo's, NCCL's
TIMED_OUT = re.compile(r"did not finish within|[Tt]imed out|[Tt]imeout")
# a rank that failed because a peer did (its recorded error): it gave up waiting, its
# peer's connection closed, or Horovod shut down after an exception on another rank
_FOLLOWED = re.compile(
    TIMED_OUT.pattern + r"|Horovod has been shut down|[Cc]onnection (closed|reset) by peer"
)
# what an error says when its rank gave up on a peer that was lost (ours, gloo's, the
# TCP store's, NCCL's, MPI's): the elastic run's sign of a lost rank, narrower than
# TIMED_OUT (a bare "timeout" in a rank's own error is not one)
PEER_GONE = re.compile(
    r"did not finish within|[Tt]imed out|[Cc]onnection (closed|reset) by peer"
    r"|Connection was likely closed|Broken pipe"
)


class RankFailure(RuntimeError):
    """A rank exited non-zero or was killed, or its host was lost; the job was stopped.

    Fields: ``rank`` (None when unknown), ``host`` (where it ran, as its record says,
    with the host list's entry in parentheses where that differs; None when unknown),
    ``how`` it ended (``exited with code 1``, ``was killed by SIGKILL``, ``was lost
    with its host: ...``), ``exit_code``, ``signal`` (``SIGKILL``), ``step`` (the steps
    it had completed, from its record), ``last_lines`` (of its own log; ``log_tail``
    too), ``error`` (what the rank reported: ``Type: message``; ``error_type``,
    ``error_message``, ``traceback``), ``role`` (what the process was: ``train``),
    ``stage`` (a pipeline rank's stage, from its record; None otherwise),
    ``lost_with`` (other ranks the launcher saw killed by a signal with it) and
    ``summary``, the message's first sentence (``rank 1 on host b exited with code 1
    (ValueError: ...)``). The message names the host for ranks on several hosts only
    (``host_in_message``). :meth:`to_dict` gives the fields as JSON."""

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
        *,
        step: int | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
        traceback: str | None = None,
        role: str | None = None,
        host_in_message: bool = True,
        stage: int | None = None,
    ) -> None:
        if how is None:
            how = f"was killed by {signal_name}" if signal_name else f"exited with code {exit_code}"
        who = f"rank {rank}" if rank is not None else "a rank"
        if stage is not None:  # a pipeline's: which part of the model it held
            who += f" (pipeline stage {stage})"
        if host and host_in_message:
            who += f" on host {host}"
        tail = "\n".join(f"    {line}" for line in log_tail[-12:]) or "    (no output)"
        self.summary = self._summary(who, how, detail, error)  # the first sentence
        super().__init__(self._message(self.summary, tail))
        self.rank = rank
        self.host = host
        self.how = how
        self.exit_code = exit_code
        self.signal = signal_name
        self.step = step
        self.last_lines = list(log_tail)
        self.error = error
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback
        self.role = role
        self.stage = stage
        self.lost_with: list[int] = []

    @property
    def log_tail(self) -> list[str]:
        """``last_lines``, by its older name."""
        return self.last_lines

    def to_dict(self) -> dict[str, Any]:
        """The fields, as a JSON-able dict (``bad_input``: a RankInputError)."""
        return {
            "rank": self.rank,
            "host": self.host,
            "how": self.how,
            "summary": self.summary,
            "error": self.error,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "step": self.step,
            "role": self.role,
            "stage": self.stage,
            "lost_with": list(self.lost_with),
            "bad_input": isinstance(self, InputError),
            "last_lines": list(self.last_lines),
            "log_tail": list(self.last_lines),
            "traceback": self.traceback,
        }

    @staticmethod
    def _summary(who: str, how: str, detail: str, error: str | None) -> str:
        return f"{who} {how}{detail}"

    @staticmethod
    def _message(summary: str, tail: str) -> str:
        return f"{summary}; the other ranks were stopped.\nLast lines of its log:\n{tail}"


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


def signal_name(code: int | None) -> str | None:
    """The signal an exit code says the process died of (``-N``, or a shell's
    ``128 + N``), else None."""
    if code is None:
        return None
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return signal.Signals(code - 128).name
    return None


def host_of(job: Job, rank: int | None) -> str | None:
    """The host ``rank`` ran on: the name its record gives, and the host list's entry
    for it where that differs; None when neither is known."""
    if rank is None:
        return None
    listed = None
    if job.hosts is not None:
        if rank in job.node_of_rank:
            listed = job.node_hosts[job.node_of_rank[rank]]
        elif not job.node_hosts:
            listed = job.hosts.placement(rank + 1)[rank]
    reported = job.placement.get(rank)
    if reported and listed and reported != listed:
        return f"{reported} ({listed})"
    return reported or listed


def ranks_on(job: Job, host: str) -> list[int]:
    """The ranks that ran on ``host`` (a reported name or a host list entry)."""
    found = {r for r, h in job.placement.items() if h == host}
    found |= {r for r, k in job.node_of_rank.items() if job.node_hosts[k] == host}
    if not found and job.hosts is not None and not job.node_hosts:
        found = {r for r, h in enumerate(job.hosts.placement(job.nprocs)) if h == host}
    return sorted(found)


def diagnose(job: Job, ending: Ending) -> RankFailure:
    """The RankFailure that names how ``job`` failed (see the module docstring)."""
    lost = _lost_host(job, ending.codes)
    if lost is not None:
        return _host_lost(job, *lost)
    # the failures in the order they happened, except that a rank which failed because
    # a peer did comes after every rank that failed of its own accord: on a loaded
    # machine the peer's record can be written before the cause's
    failures = sorted(
        (r for r in job.records.values() if r.failed),
        key=lambda r: (_FOLLOWED.search(r.error) is not None, r.time or 0.0),
    )
    rank, code, sig = _first_failed(job, ending, failures)
    failure = next((f for f in failures if f.rank == rank), None)
    detail = f" ({failure.error})" if failure is not None and sig is None else ""
    how = None
    missing = _never_ready(job, failures)
    if missing is not None and any(TIMED_OUT.search(f.error) for f in failures):
        # the rank that gave up waiting is not the cause: the one that never arrived is
        waited, rank, code, sig, failure = rank, missing, None, None, None
        how = f"{STALLED} (it hung, was stopped, or is too slow)"
        detail = f"; rank {waited} gave up waiting for it{detail}"
    record = job.records.get(rank) if rank is not None else None
    kind = RankInputError if failure is not None and failure.fail_fast else RankFailure
    found = kind(
        rank,
        code,
        sig,
        _tail(job, rank),
        detail,
        how,
        host=host_of(job, rank),
        error=failure.error if failure is not None else None,
        step=None if record is None else record.step,
        error_type=None if failure is None else failure.type,
        error_message=None if failure is None else failure.message,
        traceback=None if failure is None else failure.traceback,
        role=None if record is None else record.role,
        host_in_message=job.hosts is not None,
        stage=None if record is None else record.stage,
    )
    found.lost_with = [r for r in _killed(job, ending) if r != rank]
    return found


def _killed(job: Job, ending: Ending) -> list[int]:
    """Every rank the launcher saw killed by a signal other than SIGTERM (with which the
    launchers stop the others): the direct launcher's exit statuses, read before it
    stopped anyone; mpirun's and torchrun's words."""
    if job.direct:
        codes = [(k, c) for k, c in enumerate(ending.codes) if c is not None]
        codes += [f for f in ending.failed if ending.codes[f[0]] is None]
        return sorted({k for k, c in codes if signal_name(c) not in (None, "SIGTERM")})
    text = _launcher_text(job)
    found = {int(m.group(1)) for m in _MPI_SIGNAL.finditer(text) if int(m.group(2)) != 15}
    found |= {
        int(m.group(1))
        for m in _TORCHRUN.finditer(text)
        if signal_name(int(m.group(2))) not in (None, "SIGTERM")
    }
    return sorted(found)


def _tail(job: Job, rank: int | None) -> list[str]:
    """The rank's own last lines; the launcher's only when the rank printed none."""
    with job.lock:
        return list(job.tails.get(rank) or job.lines[-TAIL:])


def _launcher_text(job: Job) -> str:
    with job.lock:
        return "\n".join([*job.lines, *(line for t in job.tails.values() for line in t)])


def _first_failed(
    job: Job, ending: Ending, failures: list[RankRecord]
) -> tuple[int | None, int | None, str | None]:
    """(rank, exit code, signal) of the rank that failed first: a rank killed by a
    signal as the launcher saw it, else the first failure recorded (a rank failing of
    its own accord before one failing because of a peer), else what the
    launcher said of a rank that aborted or exited non-zero. The code is None where
    there is a signal."""
    earliest = failures[0].rank if failures else None
    if job.direct and ending.failed:
        # SIGKILL comes from outside the job (a person, the OOM killer): the cause, even
        # when a peer failed because of it before we looked
        killed = [(k, c) for k, c in ending.failed if signal_name(c) == "SIGKILL"]
        rank, code = (killed or ending.failed)[0]
        sig = signal_name(code)
        if sig is None and earliest is not None and earliest != rank:
            # both exited non-zero before we looked: the one that failed first is the
            # cause, the other failed because of it
            rank, code = earliest, job.procs[earliest].poll() or 1
        return rank, None if sig else code, sig
    text = _launcher_text(job)
    code = ending.failed[0][1] if ending.failed else None
    root = _TORCHRUN.search(text.rpartition("Root Cause")[2])
    if (m := _MPI_SIGNAL.search(text)) is not None:
        return int(m.group(1)), None, signal.Signals(int(m.group(2))).name
    if root is not None and signal_name(int(root.group(2))) == "SIGKILL":
        return int(root.group(1)), None, "SIGKILL"
    if earliest is not None:
        return earliest, 1, None
    if (m := _MPI_CALLED_ABORT.search(text) or _MPI_ABORT.search(text)) is not None:
        return int(m.group(1)), code, None
    if (m := _MPI_EXIT.search(text)) is not None:
        return int(m.group(1)), int(m.group(2)), None
    if root is not None:
        code = int(root.group(2))
        sig = signal_name(code)
        return int(root.group(1)), None if sig else code, sig
    sig = signal_name(code)
    return None, None if sig else code, sig


def stalled_rank(job: Job) -> int | None:
    """When a rank that failed timed out waiting, and every other failed because a peer
    did (gloo's "connection closed by peer": the one that gave up left while this one
    still waited): the rank that had reached its first collective but then neither
    failed, nor finished, nor saved a rescue (an elastic survivor does), the one that
    stopped answering. None if there is none, or more than one could be (a launcher
    that killed the others before they said anything)."""
    failures = [r for r in job.records.values() if r.failed]
    if not any(TIMED_OUT.search(f.error) for f in failures):
        return None
    if not all(_FOLLOWED.search(f.error) for f in failures):
        return None
    quiet = [
        r
        for r, rec in sorted(job.records.items())
        if r in job.ready and not rec.answered  # (made to stop: it answered)
    ]
    if job.direct:  # the direct launcher saw which processes were still running
        quiet = [r for r in quiet if r < len(job.procs) and job.procs[r].returncode in (None, -9)]
    return quiet[0] if len(quiet) == 1 else None


def _never_ready(job: Job, failures: list[RankRecord]) -> int | None:
    """The first rank that never reached its first collective nor reported a failure,
    once some rank did reach it; None if there is none."""
    if not job.ready:
        return None
    reported = {f.rank for f in failures}
    missing = sorted(set(range(job.nprocs)) - job.ready - reported)
    return missing[0] if missing else None


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
            how = f"with code {c}" if c >= 0 else f"by {signal_name(c)}"
            return job.node_hosts[k], (
                f"the connection to its torchrun ended (the rsh agent exited {how}): the "
                "host died, or the network to it failed"
            )
    return None


def _host_lost(job: Job, host: str, why: str) -> RankFailure:
    ranks = ranks_on(job, host)
    rank = ranks[0] if ranks else None
    others = f" (ranks {', '.join(map(str, ranks))} ran there)" if len(ranks) > 1 else ""
    record = job.records.get(rank) if rank is not None else None
    return RankFailure(
        rank,
        None,
        None,
        _tail(job, rank),
        others,
        how=f"was lost with its host: {why}",
        host=host_of(job, rank) or host,
        step=None if record is None else record.step,
        role=None if record is None else record.role,
    )
