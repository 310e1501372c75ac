"""DataLoader workers (data.workers) start from a fork server: whatever ends the process
that reads through them, they end, and the fork server with them. Before, a rank
SIGKILLed mid-epoch left its workers (the fork server's children, which torch's own
watchdog takes for their reader) and the fork server waiting forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

DATASET = """
import time

import numpy as np


class Slow:
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.05)
        return np.zeros(3, np.float32), 0
"""

READER = """
from slow_items import Slow

from dagtrain.training.rank.samples import read_items

if __name__ == "__main__":
    items = read_items("slow_items:Slow", Slow(), workers=2, chunk=4)
    next(items)
    print("reading", flush=True)
    for _ in items:
        pass
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_reader_takes_its_workers_and_the_fork_server_with_it(tmp_path: Path):
    (tmp_path / "slow_items.py").write_text(DATASET)
    (tmp_path / "reader.py").write_text(READER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    reader = subprocess.Popen(
        [sys.executable, str(tmp_path / "reader.py")], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout.readline().strip() == "reading"
        family = [p.pid for p in psutil.Process(reader.pid).children(recursive=True)]
        assert len(family) >= 3, family  # the fork server and its two workers
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=30)
        deadline = time.monotonic() + 60  # a loaded machine; they go within a second
        while time.monotonic() < deadline and not all(_gone(p) for p in family):
            time.sleep(0.2)
        left = [p for p in family if not _gone(p)]
        assert not left, [psutil.Process(p).cmdline()[:4] for p in left]
    finally:
        if reader.poll() is None:
            reader.kill()
        for p in psutil.Process().children(recursive=True):
            p.kill()
