"""A built-in model that tells, in a file per rank, how many training steps it has
started (as benchmarks/elastic_model.py's MLP does), so that a test kills a rank at a
step; ``kind`` picks the built-in, ``data`` (the DataInfo) reaches it."""

from __future__ import annotations

import os
import struct

from benchmarks.elastic_model import _FORMAT
from dagtrain.training.rank.models import build_model


def counted(in_shape, classes, kind="mlp", data=None, **args):
    model = build_model(kind, in_shape, classes, data, **args)
    folder = os.environ.get("DAGTRAIN_BENCH_STEPS")
    if not folder:
        return model
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    fd = os.open(os.path.join(folder, f"rank{rank}.steps"), os.O_RDWR | os.O_CREAT, 0o644)
    count, pid = [0], os.getpid()

    def started(module, inputs):
        if module.training:
            count[0] += 1
            os.pwrite(fd, struct.pack(_FORMAT, count[0], 0.0, 0.0, pid), 0)

    model.register_forward_pre_hook(started)
    return model
