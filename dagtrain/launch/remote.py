"""The far end of a torchrun node that the launcher starts on another host.

    AGENT HOST python -m dagtrain.launch.remote [--env NAME=VALUE]... -- ARGV...

It runs ``ARGV`` (a torchrun) with the variables given (a remote shell does not carry
the launcher's environment) in a process group of its own, and ends that group, and so
the node's ranks, when any of these happens:

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
import os
import signal
import subprocess
import sys
import threading
import time

from dagtrain.rank_env import parent_death_signal

__all__ = ["main"]

GRACE = 5.0  # seconds between SIGTERM and SIGKILL of the node's group


def _parse(args: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i] != "--":
        if args[i] != "--env" or i + 1 >= len(args) or "=" not in args[i + 1]:
            raise SystemExit(
                "usage: python -m dagtrain.launch.remote [--env NAME=VALUE]... -- ARGV..."
            )
        name, _, value = args[i + 1].partition("=")
        env[name] = value
        i += 2
    argv = args[i + 1 :]
    if not argv:
        raise SystemExit("dagtrain.launch.remote: nothing to run after --")
    return env, argv


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def main(args: list[str] | None = None) -> int:
    env, argv = _parse(sys.argv[1:] if args is None else args)
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
