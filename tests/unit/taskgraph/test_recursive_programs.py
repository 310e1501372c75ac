"""Random recursive programs end as their sequential elision, under a low recursion limit.

A program is a tree of tasks (depth <= 8, up to 5,000 tasks). Every task body

* reads and writes the items of its parent's scope that its clauses declare (all five
  kinds, as in ``test_properties.py``; some read a value through ``Ref``);
* adds children on its own items, with random clauses, priorities and ``after=``
  edges, interleaved with ``taskwait`` on one item (any clause kind), after which it
  reads (``in_``) or overwrites (``out``/``inout``) that item itself;
* ends with a ``taskwait`` for all, or runs its children inside a ``taskgroup``, or
  returns without waiting (its children then finish after it).

The sequential elision (each task run to its end where it is added, waits doing
nothing) defines the result. Every run, at 1 to 4 workers, must end in the same
state with the same log, with the recursion limit lowered to 200: OpenMP's task
scheduling constraint bounds how deep the waits nest by the program's depth.
"""

from __future__ import annotations

import random
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dagtrain.taskgraph import Ref, TaskGraph

ITEMS = 4
KINDS = ("in_", "out", "inout", "mutexinoutset", "inoutset")
LIMIT = 200


@dataclass
class Node:
    tid: int
    clauses: dict[str, list[int]]  # on the items of the parent's scope
    ref: int | None  # an item read through Ref
    after: int | None  # index of an earlier sibling to run after
    priority: int
    mode: str  # "wait", "group" or "nowait": how the body ends
    ops: list = field(default_factory=list)  # ("spawn", Node) | ("wait", kind, item)


def generate(seed: int, max_depth: int, max_tasks: int, fanout: int) -> list[Node]:
    """The top-level tasks of a random program: at most ``max_tasks`` tasks in all, on
    ``max_depth`` levels (the top-level tasks are the first)."""
    rng = random.Random(seed)
    budget = [max_tasks]
    counter = [0]

    def siblings(depth: int, count: int) -> list:
        ops: list = []
        writer = dict.fromkeys(range(ITEMS), False)  # last change by an out/inout task
        for spawned in range(count):  # spawned: how many siblings came before
            if budget[0] <= 0:
                break
            budget[0] -= 1
            clauses: dict[str, list[int]] = {}
            for item in range(ITEMS):
                kind = rng.choice((None, None, None, *KINDS))
                if kind is not None:
                    clauses.setdefault(kind, []).append(item)
            readable = [
                i
                for i in range(ITEMS)
                if writer[i]
                and i not in clauses.get("mutexinoutset", ())
                and i not in clauses.get("inoutset", ())
            ]
            ref = rng.choice(readable) if readable and rng.random() < 0.3 else None
            for kind, its in clauses.items():
                for i in its:
                    if kind in ("out", "inout"):
                        writer[i] = True
                    elif kind != "in_":
                        writer[i] = False
            node = Node(
                tid=counter[0],
                clauses=clauses,
                ref=ref,
                after=rng.randrange(spawned) if spawned and rng.random() < 0.2 else None,
                priority=rng.randint(-1, 1),
                mode=rng.choice(("wait", "wait", "group", "nowait")) if depth else "wait",
            )
            counter[0] += 1
            if depth + 1 < max_depth:  # bushy near the top, thinning out below
                node.ops = siblings(depth + 1, rng.randint(1 if depth < 3 else 0, fanout))
            ops.append(("spawn", node))
            if depth and rng.random() < 0.3:
                kind = rng.choice(KINDS)
                item = rng.randrange(ITEMS)
                ops.append(("wait", kind, item))
                if kind in ("out", "inout"):
                    writer[item] = False  # the parent itself overwrites it
        return ops

    return [op[1] for op in siblings(0, max(1, fanout))]


def fresh() -> dict:
    return {i: (0, []) for i in range(ITEMS)}


def canonical(state: dict) -> tuple:
    return tuple((k, v, tuple(sorted(bag))) for k, (v, bag) in sorted(state.items()))


class Sequential:
    """The sequential elision: a task runs to its end where it is added."""

    def spawn(self, node: Node, pstate: dict, log: dict, siblings: list) -> None:
        ref = (pstate[node.ref][0],) if node.ref is not None else ()
        body(node, pstate, log, self)(*ref)

    def taskwait(self, **clauses) -> None:
        pass

    def taskgroup(self):
        return nullcontext()


class Parallel:
    def __init__(self, g: TaskGraph) -> None:
        self.g = g

    def spawn(self, node: Node, pstate: dict, log: dict, siblings: list) -> None:
        args = (Ref(node.ref),) if node.ref is not None else ()
        after = [siblings[node.after]] if node.after is not None else []
        siblings.append(
            self.g.add(
                body(node, pstate, log, self),
                *args,
                name=f"t{node.tid}",
                priority=node.priority,
                after=after,
                **{k: tuple(v) for k, v in node.clauses.items()},
            )
        )

    def taskwait(self, **clauses) -> None:
        self.g.taskwait(**clauses)

    def taskgroup(self):
        return self.g.taskgroup()


def body(node: Node, pstate: dict, log: dict, ex):
    c = node.clauses

    def run(*ref) -> int:
        seen: list = []
        for item in c.get("in_", []) + c.get("inout", []):
            v, bag = pstate[item]
            seen.append((item, v, tuple(sorted(bag))))
        if ref:
            assert ref[0] == pstate[node.ref][0]  # the Ref gets the version it reads
            seen.append(("ref", ref[0]))
        local = fresh()
        kids: list = []
        with ex.taskgroup() if node.mode == "group" else nullcontext():
            for op in node.ops:
                if op[0] == "spawn":
                    ex.spawn(op[1], local, log, kids)
                    continue
                _, kind, item = op
                ex.taskwait(**{kind: item})
                if kind in ("in_", "out", "inout"):
                    v, bag = local[item]
                    seen.append(("wait", kind, item, v, tuple(sorted(bag))))
                if kind in ("out", "inout"):
                    local[item] = (hash((node.tid, "parent", item)) & 0xFFFF, [])
        if node.mode == "wait":
            ex.taskwait()
        if node.mode != "nowait":  # all children are done: their effects are final
            seen.append(("local", canonical(local)))
        log[node.tid] = tuple(seen)
        value = hash((node.tid, tuple(seen))) & 0xFFFF
        for item in c.get("out", []) + c.get("inout", []):
            pstate[item] = (value, [])
        for item in c.get("mutexinoutset", []):
            v, bag = pstate[item]
            time.sleep(0)  # let another thread in: an overlap would lose an update
            pstate[item] = (v + node.tid + 1, bag)
        for item in c.get("inoutset", []):
            pstate[item][1].append(node.tid)
        return value

    return run


@contextmanager
def recursion_limit(n: int):
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(n)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def ntasks(nodes: list[Node]) -> int:
    return sum(1 + ntasks([op[1] for op in n.ops if op[0] == "spawn"]) for n in nodes)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same examples every time
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), workers=st.integers(1, 4))
@example(seed=40, workers=1).via("5,000 tasks on 8 levels, one worker")
@example(seed=83, workers=2).via("5,000 tasks on 8 levels, two workers")
@example(seed=93, workers=4).via("5,000 tasks on 8 levels, four workers")
def test_recursive_programs_end_as_their_sequential_elision(seed, workers):
    rng = random.Random(seed)  # the program's shape, drawn from the seed
    depth, fanout = rng.randint(1, 8), rng.randint(2, 6)
    tasks = rng.choice((5000, rng.randint(1, 5000)))
    top = generate(seed, depth, tasks, fanout)
    assert ntasks(top) <= tasks

    expected, expected_log = fresh(), {}
    seq = Sequential()
    for node in top:
        seq.spawn(node, expected, expected_log, [])

    state, log = fresh(), {}
    g = TaskGraph()
    par = Parallel(g)
    siblings: list = []
    for node in top:  # the top-level tasks are built before the run, and replayed
        par.spawn(node, state, log, siblings)
    for attempt in range(2):
        if attempt:
            state.clear()
            state.update(fresh())
            log.clear()
        with recursion_limit(LIMIT):
            report = g.run(workers=workers, timeout=60)
        assert {r.state for r in report} == {"done"}
        assert len(report) == len(expected_log)
        assert canonical(state) == canonical(expected)
        assert log == expected_log
