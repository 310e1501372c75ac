"""The model of benchmarks/elastic.py: the registry's MLP, which also tells the
benchmark, in a file per rank, how many training steps it has started and when its
backward last ended, and which process it is (``DAGTRAIN_BENCH_STEPS``: the folder;
the next world's process of the same rank writes the same file). The same for every
system measured, so that each is timed the same way; tests/integration/test_elastic.py
kills ranks at a step with it."""

from __future__ import annotations

import os
import struct
import time

from dagtrain.training.rank.models import build_model


def mlp(in_shape, classes, hidden=(256, 256)):
    model = build_model("mlp", in_shape, classes, hidden=list(hidden))
    folder = os.environ.get("DAGTRAIN_BENCH_STEPS")
    if not folder:
        return model
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    fd = os.open(os.path.join(folder, f"rank{rank}.steps"), os.O_RDWR | os.O_CREAT, 0o644)
    count, first, pid = [0], [0.0], os.getpid()

    def started(module, args):
        if module.training:
            count[0] += 1
            os.pwrite(fd, struct.pack(_FORMAT, count[0], 0.0, first[0], pid), 0)

    def ended(param):  # the first layer's weight: its gradient is backward's last
        now = time.time()
        first[0] = first[0] or now
        os.pwrite(fd, struct.pack(_FORMAT, count[0], now, first[0], pid), 0)

    model.register_forward_pre_hook(started)
    weight = next(p for p in model.parameters())
    weight.register_post_accumulate_grad_hook(ended)
    return model


_FORMAT = "<qddq"  # steps started, last backward's end, first backward's end, pid
_SIZE = struct.calcsize(_FORMAT)


def read(path: str, pid: int | None = None) -> tuple[int, float, float]:
    """(training steps this process started, unix time its last backward ended (0 while
    one runs), unix time its first backward ended); with ``pid``, those of process
    ``pid`` only (nothing yet while the file is an earlier process's)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE)
    except OSError:
        return 0, 0.0, 0.0
    if len(data) != _SIZE:
        return 0, 0.0, 0.0
    count, last, first, writer = struct.unpack(_FORMAT, data)
    if pid is not None and writer != pid:
        return 0, 0.0, 0.0
    return count, last, first
