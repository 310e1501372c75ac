"""The far end of a torchrun node that the launcher starts on another host.

    AGENT HOST python -m dagtrain.launch.remote -- ARGV...

It reads one line from its input, a JSON object of the variables to give ``ARGV`` (a
remote shell does not carry the launcher's environment, and they are often secrets: on
a command line every user of the host could read them), within ``FIRST_LINE`` seconds.
It then runs ``ARGV`` (a torchrun) with them in a process group of its own, and ends
that group, and so the node's ranks, when any of these happens:

- its input reaches EOF: the launcher closed the pipe to the rsh agent, or died, or
  the agent's connection to this host closed (ssh forwards the EOF);
- it gets SIGTERM, SIGHUP or SIGINT (sshd sends SIGHUP when a session is torn down);
- it dies itself: ARGV's process has it as parent and gets SIGTERM from the kernel
  (``PR_SET_PDEATHSIG``); each rank does the same with its torchrun.

It exits with ARGV's exit code (128 + N for a signal N), as ssh reports it back.
Standard library only: it imports nothing of torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from dagtrain.rank_env import parent_death_signal

__all__ = ["main"]

GRACE = 5.0  # seconds between SIGTERM and SIGKILL of the node's group


USAGE = "usage: python -m dagtrain.launch.remote -- ARGV... (its variables: a JSON line on stdin)"
FIRST_LINE = 60.0  # seconds for the launcher's line of variables to arrive


def _parse(args: list[str]) -> list[str]:
    if not args or args[0] != "--" or len(args) < 2:
        raise SystemExit(USAGE)
    return args[1:]


def _variables(timeout: float = FIRST_LINE) -> dict[str, str]:
    """The first line of the input: a JSON object of names to string values. Read from
    the raw descriptor, a byte at a time, so that nothing after it is taken from the
    input watch."""
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([0], [], [], left)[0]:
            raise SystemExit(f"dagtrain.launch.remote: no variables on stdin in {timeout:g} s")
        got = os.read(0, 1)
        if not got:
            raise SystemExit("dagtrain.launch.remote: stdin closed before its variables")
        line += got
    try:
        env = json.loads(line)
    except ValueError:
        env = None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise SystemExit(
            "dagtrain.launch.remote: the first line of stdin is not a JSON object of strings"
        )
    return env


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def main(args: list[str] | None = None) -> int:
    argv = _parse(sys.argv[1:] if args is None else args)
    env = _variables()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        # this process's death (SIGKILL included) stops the node too
        preexec_fn=parent_death_signal(signal.SIGTERM),  # noqa: PLW1509
    )
    # the signal handler and the input thread only raise a flag; this thread alone
    # waits for the child and signals it (Popen's wait is not to be shared)
    stop = threading.Event()

    def watch_input() -> None:
        # the raw descriptor: a thread blocked in sys.stdin's buffer would hold its lock
        # and abort the interpreter's exit
        with contextlib.suppress(OSError):
            while os.read(0, 65536):
                pass
        if proc.poll() is None:
            print(
                "dagtrain.launch.remote: the launcher's connection closed; stopping the node",
                file=sys.stderr,
                flush=True,
            )
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.set())
    threading.Thread(target=watch_input, daemon=True).start()
    term_sent: float | None = None
    while (code := proc.poll()) is None:
        if stop.is_set():
            now = time.monotonic()
            if term_sent is None:
                _kill_group(proc.pid, signal.SIGTERM)
                term_sent = now
            elif now - term_sent > GRACE:
                _kill_group(proc.pid, signal.SIGKILL)
        time.sleep(0.05)
    _kill_group(proc.pid, signal.SIGKILL)  # whatever of the node's group is left
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not through finalization: the input thread may still be reading
