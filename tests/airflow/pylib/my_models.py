"""A DAG author's model module, put beside the DAG files by the tests (not on PYTHONPATH)."""

import math

from torch import nn


def small_mlp(in_shape, classes, width=64):
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.ReLU(), nn.Linear(width, classes)
    )
