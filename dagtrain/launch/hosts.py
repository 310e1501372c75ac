"""Where the ranks of a job run when they span machines, and how to reach them.

A :class:`Hosts` is a list of ``host:slots`` entries (``slots`` ranks on ``host``, in
that order: ranks 0..slots-1 on the first host, and so on) plus how the launcher
reaches a host that is not this one:

- ``rsh_agent``: the argv prefix of a remote-shell command, ``ssh`` by default. It is
  called as ``AGENT... HOST WORD...`` and must run ``WORD...`` on HOST as ssh does
  (the words joined by spaces, read by the remote login shell). Open MPI gets it as
  ``--mca plm_rsh_agent`` (one string that Open MPI splits on spaces: an element may
  hold no whitespace); torchrun's nodes are started through it by dagtrain.
- ``env``: variables every rank gets on every host (``GLOO_SOCKET_IFNAME``,
  ``NCCL_SOCKET_IFNAME``, ...): a remote shell does not carry this one's environment.
- ``rdzv_port``: the port of torchrun's c10d rendezvous on the first host.

In Airflow, a pipeline names an Airflow Connection in ``distributed.hosts_connection``
(a config-file-only field), whose ``extra`` is the JSON object :func:`from_extra`
reads::

    {"hosts": ["10.0.0.2:1", "10.0.0.3:1"], "rsh_agent": ["ssh", "-p", "2222"],
     "env": {"GLOO_SOCKET_IFNAME": "eth0"}, "rdzv_port": 29400}

Standard library only; every bad value is refused with its field named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagtrain.errors import InputError

__all__ = ["DEFAULT_RDZV_PORT", "EXTRA_KEYS", "Hosts", "answers", "from_extra"]

DEFAULT_RDZV_PORT = 29400  # torchrun's own default
EXTRA_KEYS = ("hosts", "rsh_agent", "env", "rdzv_port")
# a name or address; never starting with '-', which ssh (the rsh agent) would read as
# one of its options (-oProxyCommand=...)
_HOST = re.compile(
    r"^(?P<host>[A-Za-z0-9_.][A-Za-z0-9_.\-]*|\[[0-9A-Fa-f:.]+\])(?::(?P<slots>\d+))?$"
)
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


@dataclass(frozen=True)
class Hosts:
    """``host:slots`` entries and how to reach them; see the module docstring."""

    entries: tuple[str, ...]
    rsh_agent: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    rdzv_port: int = DEFAULT_RDZV_PORT
    source: str = "distributed.hosts"  # what the messages name

    def __post_init__(self) -> None:
        if not self.entries:
            raise InputError(f"{self.source}: the host list is empty; give 'host:slots' entries")
        for i, e in enumerate(self.entries):
            m = _HOST.match(e) if isinstance(e, str) else None
            if m is None or (m.group("slots") is not None and int(m.group("slots")) < 1):
                raise InputError(
                    f"{self.source}[{i}]: {e!r} is not 'host:slots' (a host name or address, "
                    "and a number of ranks >= 1 on it, e.g. '10.0.0.2:1')"
                )
        for i, word in enumerate(self.rsh_agent):
            if not isinstance(word, str) or not word or any(c.isspace() for c in word):
                raise InputError(
                    f"{self._field('rsh_agent')}[{i}]: {word!r} must be a "
                    "non-empty string without whitespace (Open MPI splits the agent on spaces); "
                    "put a longer command in a script and name the script"
                )
        for k, v in self.env.items():
            if not isinstance(k, str) or not _VAR.match(k) or not isinstance(v, str):
                raise InputError(
                    f"{self._field('env')}: {k!r}: {v!r} is not a variable name and a string value"
                )
        if not isinstance(self.rdzv_port, int) or not 1 <= self.rdzv_port <= 65535:
            raise InputError(
                f"{self._field('rdzv_port')}: {self.rdzv_port!r} is not a TCP port (1-65535)"
            )

    def _field(self, name: str) -> str:
        """The name of field ``name`` beside ``source`` in messages."""
        head, _, _ = self.source.rpartition("hosts")
        return head + name

    @classmethod
    def of(cls, value: Hosts | Sequence[str] | None) -> Hosts | None:
        """``value`` as Hosts: a Hosts as it is, a list of entries with the defaults."""
        if value is None or isinstance(value, Hosts):
            return value
        if isinstance(value, str):
            value = [value]
        entries = tuple(value)
        return cls(entries) if entries else None

    @property
    def names(self) -> list[str]:
        """The host of each entry, without its slots."""
        return [_HOST.match(e).group("host") for e in self.entries]

    @property
    def slots(self) -> list[int]:
        """The ranks of each entry (1 where an entry gives none)."""
        return [int(_HOST.match(e).group("slots") or 1) for e in self.entries]

    def placement(self, nprocs: int) -> list[str]:
        """The host of each rank, slots filled in order (Open MPI's ``--map-by slot``);
        ranks past the last slot wrap around, as ``--oversubscribe`` places them."""
        order = [h for h, n in zip(self.names, self.slots) for _ in range(n)]
        return [order[r % len(order)] for r in range(nprocs)]

    def agent(self) -> list[str]:
        """The rsh agent's argv prefix (``ssh`` when none was given)."""
        return list(self.rsh_agent) or ["ssh"]


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine: localhost, its hostname, or one of the
    addresses of its network interfaces (of this network namespace)."""
    import socket

    h = host.strip("[]")
    if h in _LOCAL_NAMES or h.startswith("127.") or h == socket.gethostname():
        return True
    try:
        import psutil  # an Airflow dependency; without it only the names above count
    except ImportError:
        return False
    try:
        wanted = {ai[4][0] for ai in socket.getaddrinfo(h, None)}
    except OSError:
        return False
    mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return bool(wanted & mine)


def from_extra(conn_id: str, extra: str | Mapping[str, Any] | None) -> Hosts:
    """The Hosts an Airflow Connection's ``extra`` describes (see the module docstring);
    InputError naming the connection and the key for anything else."""
    where = f"Airflow connection {conn_id!r}"
    how = (
        f'; set its extra to a JSON object like {{"hosts": ["10.0.0.2:1", "10.0.0.3:1"]}} '
        f"(`airflow connections add {conn_id} --conn-type generic --conn-extra '...'`)"
    )
    if extra is None:  # a connection without an extra
        extra = {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra) if extra.strip() else {}
        except ValueError as e:
            raise InputError(f"{where}: its extra is not valid JSON ({e}){how}") from e
    if not isinstance(extra, Mapping):
        raise InputError(f"{where}: its extra is not a JSON object{how}")
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise InputError(
            f"{where}: extra has unknown key(s) {', '.join(map(repr, unknown))}; the keys "
            f"are {', '.join(EXTRA_KEYS)}"
        )
    hosts = extra.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise InputError(f"{where}: extra.hosts must be a non-empty list of 'host:slots'{how}")
    agent = extra.get("rsh_agent", [])
    if isinstance(agent, str) or not isinstance(agent, list):
        raise InputError(
            f"{where}: extra.rsh_agent must be a list of words (an argv prefix such as "
            '["ssh", "-p", "2222"]), not ' + type(agent).__name__
        )
    env = extra.get("env", {})
    if not isinstance(env, Mapping):
        raise InputError(f"{where}: extra.env must be an object of variable: string")
    port = extra.get("rdzv_port", DEFAULT_RDZV_PORT)
    if isinstance(port, bool):
        port = None
    return Hosts(
        tuple(hosts),
        tuple(agent),
        dict(env),
        port,
        source=f"{where}: extra.hosts",
    )


def answers(hosts: Hosts | None, host: str, timeout: float = 5.0) -> bool:
    """Whether ``host`` answers: this machine always does; another must run ``true``
    through the host list's rsh agent within ``timeout`` seconds (argv, no shell here;
    the agent's own login shell runs the one word)."""
    import os
    import subprocess

    if is_local(host):
        return True
    agent = hosts.agent() if hosts is not None else ["ssh"]
    try:
        done = subprocess.run(
            [*agent, host, "true"],
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            env={**os.environ, **dict(hosts.env if hosts else {})},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
