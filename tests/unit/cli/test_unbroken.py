"""A console whose reader went away (``dagtrain up | tee``, Ctrl-C ends tee too) drops
what is printed after that instead of raising, so the cleanup behind it still runs."""

from __future__ import annotations

import os

from rich.console import Console

from dagtrain.cli.common import Unbroken


def test_printing_to_a_pipe_whose_reader_left_neither_raises_nor_stops_what_follows():
    r, w = os.pipe()
    f = os.fdopen(w, "w", buffering=1)
    stream = Unbroken(f)
    console = Console(file=stream, soft_wrap=True)
    console.print("before")
    assert os.read(r, 100) == b"before\n"
    os.close(r)  # the reader is gone: the next write raises BrokenPipeError underneath
    after = []
    console.print("stopping Airflow ...")
    after.append("stop_all ran")
    console.print("stopped")
    assert stream.gone and after == ["stop_all ran"]
    f.close()  # its descriptor now points at /dev/null: the last flush is quiet


def test_a_stream_given_as_a_function_is_looked_up_when_written(capsys):
    import sys

    stream = Unbroken(lambda: sys.stdout)
    stream.write("now\n")
    assert capsys.readouterr().out == "now\n" and not stream.gone


def test_a_spinner_on_a_terminal_lets_everything_print(tmp_path):
    """rich's status spinner (``dagtrain up`` waiting for its api-server, ``trigger
    --wait``'s live table) puts proxies over sys.stdout/err that write to the console,
    whose stream is sys.stdout as it is then: each write went round that loop for ever
    on a terminal (piped, rich shows no spinner and nothing looped)."""
    import pty
    import select
    import subprocess
    import sys
    import time

    code = (
        "import sys\n"
        "from dagtrain.cli.common import err, out\n"
        "with out.status('waiting for the api-server'):\n"
        "    out.print('inside')\n"
        "    print('a plain print')\n"
        "    err.print('to stderr')\n"
        "out.print('Airflow is up')\n"
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, close_fds=True
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b"Airflow is up" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        proc.kill()
        os.close(master)
    text = seen.decode(errors="replace")
    assert code == 0, text
    for line in ("inside", "a plain print", "to stderr", "Airflow is up"):
        assert line in text, text
