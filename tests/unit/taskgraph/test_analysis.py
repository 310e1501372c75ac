"""Analysis without running: order, critical path, lower bound, static schedules."""

from __future__ import annotations

import random

import pytest

from dagtrain.taskgraph import Problem, TaskGraph, plan


def noop():
    return None


def diamond(costs=(1, 5, 2, 1)):
    #        a
    #      /   \
    #     b     c        b is the long branch
    #      \   /
    #        d
    g = TaskGraph()
    g.add(noop, name="a", out="x", cost=costs[0])
    g.add(noop, name="b", in_="x", out="y", cost=costs[1])
    g.add(noop, name="c", in_="x", out="z", cost=costs[2])
    g.add(noop, name="d", in_=("y", "z"), cost=costs[3])
    return g


def test_critical_path_and_its_length():
    path, length = diamond().critical_path()
    assert [t.name for t in path] == ["a", "b", "d"]
    assert length == 7


def test_lower_bound_is_the_larger_of_path_and_work_per_worker():
    g = diamond()
    assert g.lower_bound(1) == 9  # all the work on one worker
    assert g.lower_bound(2) == 7  # the critical path
    wide = TaskGraph()
    for _ in range(8):
        wide.add(noop, cost=1.0)
    assert wide.lower_bound(2) == 4


def test_analysis_names_a_task_without_cost():
    g = TaskGraph()
    g.add(noop, name="priced", cost=1)
    g.add(noop, name="unpriced")
    with pytest.raises(ValueError, match="task 'unpriced' has no cost="):
        g.critical_path()


def test_topological_order_respects_forward_after_edges():
    g = TaskGraph()
    g.add(noop, name="late", after="early")
    g.add(noop, name="early")
    assert [t.name for t in g.topological_order()] == ["early", "late"]


def random_problem(rng: random.Random, n: int, procs: int, ccr: float) -> Problem:
    costs = [rng.uniform(1, 10) for _ in range(n)]
    edges = [
        (i, j, rng.uniform(1, 10) * ccr)
        for j in range(n)
        for i in range(max(0, j - 6), j)
        if rng.random() < 0.3
    ]
    speeds = [rng.uniform(0.5, 2.0) for _ in range(procs)]
    bw = [[rng.uniform(0.5, 2.0) for _ in range(procs)] for _ in range(procs)]
    return Problem(costs, edges, speeds, bw)


@pytest.mark.parametrize("method", ["heft", "peft", "lookahead", "best"])
def test_every_method_gives_a_valid_schedule(method):
    rng = random.Random(7)
    for _ in range(5):
        pb = random_problem(rng, rng.randint(10, 60), rng.randint(2, 5), rng.choice([0.1, 1, 10]))
        s = plan(pb, method)
        s.validate(pb)  # raises on overlap, early start or a wrong duration
        assert len(s.proc) == pb.n


def test_best_is_never_worse_than_heft():
    rng = random.Random(11)
    for _ in range(8):
        pb = random_problem(rng, 40, 3, rng.choice([0.1, 1, 10]))
        assert plan(pb, "best").makespan <= plan(pb, "heft").makespan + 1e-9


def test_validate_catches_a_broken_schedule():
    pb = Problem([1.0, 1.0], [(0, 1, 0.0)], [1.0])
    s = plan(pb, "heft")
    s.start[1], s.end[1] = 0.0, 1.0  # starts before its predecessor ends
    with pytest.raises(ValueError, match="before the data"):
        s.validate(pb)


def test_graph_schedule_on_equal_workers_reaches_the_bound_on_a_fork():
    g = TaskGraph()
    for _ in range(4):
        g.add(noop, cost=1.0)
    s = g.schedule(workers=2)
    assert s.makespan == pytest.approx(g.lower_bound(2)) == 2.0
    assert sorted(s.proc) == [0, 0, 1, 1]
