"""The command line of each launcher: argv lists only, never a shell string.

- ``mpirun``   Open MPI 5: ``mpirun --bind-to none --oversubscribe --output tag
               --mca mpi_yield_when_idle 1 -np N python -m mpi4py -m ...`` (``horovodrun --mpi``
               emits options Open MPI 5 rejects, so Horovod's MPI mode goes through
               mpirun too). Hosts: ``--host a:2,b:2``.
- ``horovodrun`` ``horovodrun --gloo -np N [-H a:2,b:2] python -m ...``.
- ``torchrun`` ``torchrun --nnodes 1 --nproc-per-node N --max-restarts 0 -m ...``.
               Hosts: one torchrun per host (``--nnodes H``, that host's slots as
               ``--nproc-per-node``), all meeting at a c10d (TCP) rendezvous on the first
               host; a host that is not this one gets its torchrun through the rsh agent
               (:func:`node_argvs`).
- ``direct``   N processes started here with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
               ``MASTER_PORT`` (torch.distributed's env:// rendezvous; one host):
               :func:`direct_env`.
- remote       a torchrun node on another host: ``AGENT HOST python -m
               dagtrain.launch.remote -- torchrun ...``, its words quoted for the remote
               shell as ssh requires; its variables (the host list's ``env``: secrets,
               often) go as one JSON line on its input, never on a command line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from dagtrain.config import Launcher
from dagtrain.errors import InputError

from .hosts import Hosts, is_local

__all__ = [
    "LAUNCHERS",
    "RDZV_JOIN_TIMEOUT",
    "TORCHRUN_ENV",
    "build_argv",
    "direct_env",
    "free_port",
    "host_env",
    "node_argvs",
    "nodes_apart",
    "tool",
]

LAUNCHERS: tuple[str, ...] = get_args(Launcher)
# how long torchrun's nodes wait for each other at the rendezvous (a node that never
# comes is usually one whose agent failed, which the launcher sees sooner)
RDZV_JOIN_TIMEOUT = 120
# every torchrun prefixes each rank's lines with its global rank (its default is the
# local rank, which repeats on every host)
TORCHRUN_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[default${rank}]:"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    """The path of launcher ``name``: the venv's own, else the one on PATH."""
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


def host_env(spec: Hosts | None) -> dict[str, str]:
    """The variables a host list gives every rank."""
    return dict(spec.env) if spec is not None else {}


def nodes_apart(spec: Hosts | None) -> bool:
    """Whether torchrun needs a node per host: several hosts, or one that is not this."""
    return spec is not None and (len(spec.entries) > 1 or not is_local(spec.names[0]))


def direct_env(rank: int, nprocs: int, port: int) -> dict[str, str]:
    """What the direct launcher gives rank ``rank``: torch.distributed's env://."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def build_argv(
    launcher: str,
    nprocs: int,
    module_args: Sequence[str],
    hosts: Hosts | Sequence[str] | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """The argv of the launcher process (not used for ``direct``, nor for torchrun on
    several hosts: see :func:`node_argvs`). ``env``: variables the ranks get on every
    host (mpirun ``-x NAME``: the caller puts their values in its environment)."""
    spec = Hosts.of(hosts)
    if launcher == "mpirun":
        return _mpirun(nprocs, module_args, spec, env)
    if launcher == "horovodrun":
        return _horovodrun(nprocs, module_args, spec)
    if launcher == "torchrun":
        return _torchrun(nprocs, module_args, spec)
    raise ValueError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")


def _mpirun(
    nprocs: int, module_args: Sequence[str], spec: Hosts | None, env: dict[str, str] | None
) -> list[str]:
    argv = [
        tool("mpirun"),
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
    # names only: mpirun exports each from its own environment, where the launcher puts
    # them (a value on a command line is readable in /proc/*/cmdline by every user)
    for var in _forwarded(env) | host_env(spec):
        argv += ["-x", var]
    return [*argv, sys.executable, "-m", "mpi4py", "-m", *module_args]


def _horovodrun(nprocs: int, module_args: Sequence[str], spec: Hosts | None) -> list[str]:
    argv = [tool("horovodrun"), "--gloo", "-np", str(nprocs)]
    if spec is not None:
        if spec.rsh_agent:
            raise InputError(
                f"{spec.source}: horovodrun reaches other hosts through ssh only, not "
                f"through the rsh agent {list(spec.rsh_agent)}; choose distributed."
                "launcher mpirun (Horovod runs under mpirun too)"
            )
        argv += ["-H", ",".join(spec.entries)]
    return [*argv, sys.executable, "-m", *module_args]


def _torchrun(nprocs: int, module_args: Sequence[str], spec: Hosts | None) -> list[str]:
    if nodes_apart(spec):
        raise InputError(
            "torchrun on other hosts starts one torchrun per host: use "
            "node_argvs(), or launch(), which does"
        )
    return [
        tool("torchrun"),
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
        f"127.0.0.1:{free_port()}",
        "-m",
        *module_args,
    ]


def node_argvs(
    nprocs: int,
    module_args: Sequence[str],
    hosts: Hosts | Sequence[str],
    env: dict[str, str] | None = None,
    rdzv_id: str | None = None,
) -> list[tuple[str, list[str], str | None]]:
    """torchrun on several hosts: ``(host, argv, remote_input)`` for each host, one
    torchrun per host, each with that host's slots as its ranks, meeting at a c10d
    rendezvous on the first host (``rdzv_port``). A remote host's argv goes through the
    rsh agent and ``dagtrain.launch.remote``; its words are quoted for the remote shell,
    which an ssh-like agent hands them to (``shlex.quote``: the argv arrives as it is),
    and ``remote_input`` is the line to write to its input first: its variables as a
    JSON object (None for a node on this host)."""
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
    variables = _forwarded(env) | host_env(spec) | TORCHRUN_ENV
    out = []
    for k, (host, slots) in enumerate(zip(spec.names, spec.slots)):
        torchrun = [
            tool("torchrun"),
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
            out.append((host, torchrun, None))
        else:
            out.append((host, _remote(spec, host, torchrun), json.dumps(variables) + "\n"))
    return out


def _remote(spec: Hosts, host: str, argv: list[str]) -> list[str]:
    """``argv`` run on ``host`` through the rsh agent and ``dagtrain.launch.remote``
    (which reads the variables from its input: a remote shell does not carry this
    one's environment, and a command line is readable by every user of the host)."""
    words = [sys.executable, "-m", "dagtrain.launch.remote", "--", *argv]
    return [*spec.agent(), host, *map(shlex.quote, words)]
