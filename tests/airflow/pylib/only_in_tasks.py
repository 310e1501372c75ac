"""A model module that Airflow's task imports but a rank cannot (it needs what only a
task's environment has): the ranks refuse their input, and the task is not retried."""

import os

if "AIRFLOW_CTX_TASK_ID" not in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
    raise ImportError("only_in_tasks needs an Airflow task's environment, which a rank lacks")

import math

from torch import nn


def small(in_shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), classes))
