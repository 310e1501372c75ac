"""dagtrain.taskgraph: an op-level task-graph executor with OpenMP 5.x dependences.

Pure Python: importing it imports neither torch nor airflow. See docs/taskgraph.md.

The executor is :mod:`.graph` (building, dependence inference in :mod:`.deps`),
:mod:`.runtime` (running; :mod:`.inline` for tiny tasks), :mod:`.report` and
:mod:`.trace`. The :mod:`.analysis` subpackage (critical path, bounds, static plans in
:mod:`.analysis.schedule`) only analyses graphs; nothing in it runs one.

>>> from dagtrain.taskgraph import TaskGraph
>>> g = TaskGraph()
>>> _ = g.add(print, "load", name="load", out="batch")
>>> _ = g.add(print, "step", name="step", in_="batch", inout="w")
>>> report = g.run(workers=2)
load
step
"""

from __future__ import annotations

from .analysis import Plan, Problem, plan
from .errors import CycleError, TaskError, TaskTimeoutError
from .graph import TaskGraph, gc_paused
from .report import RunReport, TaskRecord
from .task import Event, Outputs, Ref, Task
from .trace import TraceFile, write_trace

__all__ = [
    "CycleError",
    "Event",
    "Outputs",
    "Plan",
    "Problem",
    "Ref",
    "RunReport",
    "Task",
    "TaskError",
    "TaskGraph",
    "gc_paused",
    "TaskRecord",
    "TaskTimeoutError",
    "plan",
    "TraceFile",
    "write_trace",
]
