"""The defining property: a program whose tasks touch shared state only through what
they declare ends in exactly the state of running its tasks one by one, in the order
they were added, for any number of workers.

Programs are drawn at random with all five dependence types:

* ``in``: read the item (the read goes into what the task writes and into its log);
* ``out``/``inout``: overwrite the item with a hash of everything the task read;
* ``mutexinoutset``: a read-modify-write that commutes (add a constant), done in two
  steps with a GIL switch in between, so that two members overlapping would lose
  an update;
* ``inoutset``: append to a per-item bag (concurrent members are fine; readers see the
  bag sorted, so the order inside a set does not matter).
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagtrain.taskgraph import TaskGraph

KINDS = ("in_", "out", "inout", "mutexinoutset", "inoutset")


def make_body(tid: int, spec: dict[str, list[int]], state: dict, log: dict):
    def body() -> None:
        seen = []
        for item in spec.get("in_", []) + spec.get("inout", []):
            v, bag = state[item]
            seen.append((item, v, tuple(sorted(bag))))
        log[tid] = tuple(seen)
        value = hash((tid, tuple(seen))) & 0xFFFF
        for item in spec.get("out", []) + spec.get("inout", []):
            state[item] = (value, [])
        for item in spec.get("mutexinoutset", []):
            v, bag = state[item]
            time.sleep(0)  # let another thread in: an overlap would lose an update
            state[item] = (v + tid + 1, bag)
        for item in spec.get("inoutset", []):
            state[item][1].append(tid)

    return body


programs = st.lists(
    st.tuples(
        # each task: for each item at most one clause (or none)
        st.lists(st.sampled_from((None, *KINDS)), min_size=5, max_size=5),
        st.integers(min_value=-2, max_value=2),  # priority
        st.booleans(),  # an after= edge to an earlier task
    ),
    min_size=1,
    max_size=40,
)


def build(program, state, log):
    g = TaskGraph()
    for tid, (clauses, priority, ordered) in enumerate(program):
        spec: dict[str, list[int]] = {}
        for item, kind in enumerate(clauses):
            if kind is not None:
                spec.setdefault(kind, []).append(item)
        after = [g.tasks[tid // 2]] if ordered and tid else []
        g.add(
            make_body(tid, spec, state, log),
            name=f"t{tid}",
            priority=priority,
            after=after,
            **{k: tuple(v) for k, v in spec.items()},
        )
    return g


def fresh_state():
    return {i: (0, []) for i in range(5)}


def canonical(state):
    return {k: (v, sorted(bag)) for k, (v, bag) in state.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs, workers=st.integers(min_value=1, max_value=4))
def test_any_program_ends_as_its_sequential_run(program, workers):
    expected_state, expected_log = fresh_state(), {}
    g = build(program, expected_state, expected_log)
    for t in g.tasks:  # the sequential reference: program order, one by one
        t.fn()

    state, log = fresh_state(), {}
    g = build(program, state, log)
    g.run(workers=workers)
    assert canonical(state) == canonical(expected_state)
    assert log == expected_log

    # and a replay from the same initial state gives the same again
    state.clear()
    state.update(fresh_state())
    log.clear()
    g.run(workers=workers)
    assert canonical(state) == canonical(expected_state)
    assert log == expected_log


@settings(max_examples=60, deadline=None)
@given(program=programs)
def test_names_do_not_matter(program):
    # the same program with items renamed in reverse order builds the same edges
    def edges(rename):
        g = TaskGraph()
        for tid, (clauses, _, _) in enumerate(program):
            kw: dict[str, list] = {}
            for item, kind in enumerate(clauses):
                if kind is not None:
                    kw.setdefault(kind, []).append(rename(item))
            g.add(lambda: None, name=str(tid), **kw)
        return {(t.name, s.name) for t in g.tasks for s in t.succs}

    assert edges(lambda i: f"item{i}") == edges(lambda i: ("z", 4 - i))
