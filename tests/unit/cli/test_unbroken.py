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
