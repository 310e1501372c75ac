"""Ctrl-C counted as presses: a copy of one SIGINT that arrives within a fraction of a
second (a wrapper such as ``timeout`` forwarding the terminal's) is the same press; a
person's second press, later, is the second."""

from __future__ import annotations

import os
import signal
import time

from dagtrain.cli.stop import SAME_PRESS, Interrupts


def test_a_forwarded_copy_is_one_press_and_a_later_press_the_second():
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT)  # (ignored, under nohup)
    interrupts = Interrupts(seen.append).install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the copy, microseconds later
        assert (interrupts.count, seen, interrupts.name) == (1, [1], "Ctrl-C")
        time.sleep(SAME_PRESS + 0.1)
        os.kill(os.getpid(), signal.SIGINT)
        assert (interrupts.count, seen) == (2, [1, 2])
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_closed_terminal_stops_as_ctrl_c_does():
    seen: list[int] = []
    before = signal.getsignal(signal.SIGHUP)
    interrupts = Interrupts(seen.append).install()
    try:
        os.kill(os.getpid(), signal.SIGHUP)  # its default would end the command at once
        assert (interrupts.count, seen, interrupts.name) == (1, [1], "SIGHUP")
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGHUP) is before
