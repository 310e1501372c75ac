"""The model of benchmarks/elastic.py: the registry's MLP, which also tells the
benchmark, in a file per rank, how many training steps it has started and when its
backward last ended (``DAGTRAIN_BENCH_STEPS``: the folder). The same for every system
measured, so that each is timed the same way."""

from __future__ import annotations

import os
import struct
import time

from dagtrain.training.models import build_model


def mlp(in_shape, classes, hidden=(256, 256)):
    model = build_model("mlp", in_shape, classes, hidden=list(hidden))
    folder = os.environ.get("DAGTRAIN_BENCH_STEPS")
    if not folder:
        return model
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    fd = os.open(os.path.join(folder, f"rank{rank}.steps"), os.O_RDWR | os.O_CREAT, 0o644)
    count, first = [0], [0.0]

    def started(module, args):
        if module.training:
            count[0] += 1
            os.pwrite(fd, struct.pack("<qdd", count[0], 0.0, first[0]), 0)

    def ended(param):  # the first layer's weight: its gradient is backward's last
        now = time.time()
        first[0] = first[0] or now
        os.pwrite(fd, struct.pack("<qdd", count[0], now, first[0]), 0)

    model.register_forward_pre_hook(started)
    weight = next(p for p in model.parameters())
    weight.register_post_accumulate_grad_hook(ended)
    return model


def read(path: str) -> tuple[int, float, float]:
    """(training steps this process started, unix time its last backward ended (0 while
    one runs), unix time its first backward ended)."""
    try:
        with open(path, "rb") as f:
            data = f.read(24)
    except OSError:
        return 0, 0.0, 0.0
    return struct.unpack("<qdd", data) if len(data) == 24 else (0, 0.0, 0.0)
