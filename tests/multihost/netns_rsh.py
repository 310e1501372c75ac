"""An rsh agent for the test's "hosts": network namespaces on this machine.

    python netns_rsh.py MAP.json HOST WORD...

It stands in for ssh, as Open MPI (``--mca plm_rsh_agent``) and dagtrain's torchrun
launcher call it: it runs ``WORD...`` on HOST the way ssh does — the words joined by
spaces and read by a shell there (that is ssh's contract, which both callers quote
for) — here by entering HOST's network namespace (``ip netns exec``) and a UTS
namespace of its own with HOST's hostname (real hosts have distinct hostnames, and
Open MPI tells its daemons apart by them). ``MAP.json`` maps each host address to
``{"netns": NAME, "hostname": NAME}``.

As ssh does, it stays here while the command runs there, passes its input on (the
remote side sees EOF when this end's input closes), exits with the remote command's
code, and exits 255 when the "connection" is lost (the command was killed) or the host
is unknown. SIGTERM/SIGHUP end the remote command's process group, as sshd does when a
session is torn down.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys


def enter(hostname: str, argv: list[str]) -> None:
    """Inside the new UTS namespace: take HOST's hostname, then become ``argv``."""
    socket.sethostname(hostname)
    os.execvp(argv[0], argv)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--enter":
        enter(sys.argv[2], sys.argv[3:])
    if len(sys.argv) < 4:
        print("usage: netns_rsh.py MAP.json HOST WORD...", file=sys.stderr)
        return 255
    with open(sys.argv[1]) as f:
        hosts = json.load(f)
    host, words = sys.argv[2], sys.argv[3:]
    if host not in hosts:
        print(f"netns_rsh: Could not resolve hostname {host}", file=sys.stderr)
        return 255
    ns, name = hosts[host]["netns"], hosts[host]["hostname"]
    argv = ["ip", "netns", "exec", ns, "unshare", "--uts", "--"]
    argv += [
        sys.executable,
        os.path.abspath(__file__),
        "--enter",
        name,
        "sh",
        "-c",
        " ".join(words),
    ]
    child = subprocess.Popen(argv, start_new_session=True)

    def hang_up(sig: int, _frame: object) -> None:
        try:
            os.killpg(child.pid, signal.SIGHUP)
            os.killpg(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, hang_up)
    code = child.wait()
    return 255 if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
