"""``launch()``: start N ranks, watch them, fail fast.

Three rooms: :mod:`.argv` builds each launcher's command line (mpirun, horovodrun,
torchrun, direct, remote torchrun nodes); :mod:`.supervise` starts the processes,
watches them and their status records, and stops them (deadlines, signals, no
orphans); :mod:`.diagnose` names the rank that failed, from the records the ranks
wrote and what the launchers said of the ranks they saw die.

Several hosts (:class:`~dagtrain.launch.hosts.Hosts`): mpirun reaches the others
through ``--mca plm_rsh_agent`` (ssh unless the host list names another agent) and
starts its daemons there; torchrun's remote nodes are started as ``AGENT HOST python
-m dagtrain.launch.remote ... torchrun ...``. ``dagtrain.launch.remote`` kills its
torchrun (and so the ranks) when the agent's connection closes (stdin at EOF) or it is
signalled, so a remote node never outlives the launcher. When a host is lost (its
daemon or node stopped answering), the failure names the rank that ran there and the
host.

Every rank keeps its status record (``dagtrain.rank_env``) in the job's status folder:
where it runs, whether it reached its first collective, its step, and why it failed.
When any rank exits non-zero or is killed, the others are stopped (SIGTERM, then
SIGKILL after ``grace`` seconds) and :class:`~dagtrain.launch.diagnose.RankFailure`
names the first rank that failed, its host, its exit code or signal, its error and
step as it recorded them, and its last log lines. Killing the launcher
(SIGTERM/SIGINT, or ``on_kill``) kills every rank: no orphan survives.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from dagtrain.errors import InputError
from dagtrain.rank_env import JOB_ID, STATUS_DIR

from .argv import (
    LAUNCHERS,
    TORCHRUN_ENV,
    build_argv,
    direct_env,
    free_port,
    host_env,
    node_argvs,
    nodes_apart,
)
from .diagnose import diagnose
from .hosts import Hosts, is_local
from .supervise import Job, mpirun_session, spawn, status_folder, stop_on_signals, watch

__all__ = ["launch"]


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
    status_dir: str | Path | None = None,
    job_id: str | None = None,
) -> Job:
    """Run ``python -m <module_args>`` on ``nprocs`` ranks; return the Job when all
    exit 0 (``job.placement``: the host each rank recorded).

    ``status_dir``: the job's status folder, where every rank keeps its status record
    (``dagtrain.rank_env``); ranks on other hosts need it on storage they share
    (default: a temporary folder here, removed when the job ends). ``job_id`` (default:
    a new one) goes into every record of this job: the records an earlier job left in
    the folder are not read, and stay until overwritten.

    ``hosts``: a host list (``host:slots`` entries, or a Hosts with its rsh agent and
    environment) for ranks on several machines. Raises RankFailure when a rank fails
    (RankInputError, an InputError too, when it refused its input) or a host is lost
    (the others are stopped within ``grace`` + 5 s), TimeoutError after ``timeout``
    seconds (every rank killed), InputError for a host list the launcher cannot use.
    """
    spec = _usable_hosts(launcher, nprocs, hosts)
    on_line = on_line or _to_stderr
    job_id = job_id or uuid.uuid4().hex
    with status_folder(status_dir) as folder, stop_on_signals():
        job = Job(
            direct=launcher == "direct",
            hosts=spec,
            nprocs=nprocs,
            status_dir=folder,
            job_id=job_id,
        )
        # every rank, on every host
        env = {**(env or {}), STATUS_DIR: str(folder), JOB_ID: job_id}
        with mpirun_session(launcher == "mpirun") as session:
            try:
                _start(job, launcher, module_args, spec, env, session, on_line)
                if on_start is not None:
                    on_start(job)
                ending = watch(job, timeout, grace)
            except BaseException:
                job.kill(grace)
                raise
        if ending is not None:
            raise diagnose(job, ending)
        return job


def _usable_hosts(launcher: str, nprocs: int, hosts: Hosts | Sequence[str] | None) -> Hosts | None:
    """The host list the launcher uses (None: this host alone), after checking the
    arguments."""
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, not {nprocs}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    spec = Hosts.of(hosts)
    if launcher != "direct" or spec is None:
        return spec
    elsewhere = [h for h in spec.names if not is_local(h)]
    if elsewhere:
        raise InputError(
            f"{spec.source}: launcher direct starts every rank on this host, but the "
            f"host list names {', '.join(elsewhere)}; choose distributed.launcher "
            "mpirun or torchrun to run ranks on other hosts"
        )
    return None


# torchrun's own stop on SIGTERM can hang at its exit for ever (its log tailers, which
# --tee starts, are never told to stop: seen as a torchrun alive 35 minutes after the
# process that started it was SIGKILLed, its rank a zombie). Its ranks each die with
# their parent (a SIGKILL of their own), so a SIGKILL of a local torchrun leaves nothing.
_TORCHRUN_ORPHAN = signal.SIGKILL


def _start(
    job: Job,
    launcher: str,
    module_args: Sequence[str],
    spec: Hosts | None,
    env: dict[str, str],
    session: dict[str, str],
    on_line: Callable[[str], None],
) -> None:
    """Start the job's processes: the ranks themselves (direct), a torchrun per host,
    or the one launcher process."""
    base = {**os.environ, **host_env(spec), **env, "PYTHONUNBUFFERED": "1"}
    nprocs = job.nprocs
    if launcher == "direct":
        port = free_port()
        for r in range(nprocs):
            argv = [sys.executable, "-m", *module_args]
            spawn(job, argv, {**base, **direct_env(r, nprocs, port)}, on_line, rank=r)
    elif launcher == "torchrun" and nodes_apart(spec):
        nodes = node_argvs(nprocs, module_args, spec, env)
        job.node_hosts = [host for host, _, _ in nodes]
        for k, (_, argv, remote_input) in enumerate(nodes):
            guard = _TORCHRUN_ORPHAN if remote_input is None else signal.SIGTERM
            spawn(
                job,
                argv,
                {**base, **TORCHRUN_ENV},
                on_line,
                node=k,
                remote=remote_input,
                orphan_signal=guard,
            )
    else:
        extra = TORCHRUN_ENV if launcher == "torchrun" else session
        argv = build_argv(launcher, nprocs, module_args, spec, env)
        guard = _TORCHRUN_ORPHAN if launcher == "torchrun" else signal.SIGTERM
        spawn(job, argv, {**base, **extra}, on_line, orphan_signal=guard)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
