"""The in-line build of plain tasks (inside TaskGraph.add) against the general path.

``TaskGraph.add`` wires a top-level task with only in_/out/inout on hashable items, no
Ref, keyword arguments, after or detach in one call; anything else goes through
``build_task``. ``after=[]`` names no task but takes the general path, so the same
program built both ways must give the same graph: the same successors in the same
order, the same predecessor counts, the same per-item state.
"""

from __future__ import annotations

import random

import pytest

from dagtrain.taskgraph import Ref, TaskGraph


def noop(*args, **kwargs):
    return None


def _clauses(rng: random.Random, names: list) -> dict:
    kw: dict = {}
    for clause in ("in_", "out", "inout"):
        r = rng.random()
        if r < 0.4:
            continue
        picked = rng.sample(names, k=rng.randint(1, 3))
        shape = rng.randrange(4)
        if shape == 0:
            kw[clause] = picked[0]  # one item
        elif shape == 1:
            kw[clause] = picked  # a list, duplicates possible below
        elif shape == 2:
            kw[clause] = (*picked, picked[0])
        else:
            kw[clause] = set(picked)
    return kw


def _program(seed: int, n: int = 300) -> list[dict]:
    """Random adds: mostly plain, some with a set clause, a Ref, an unhashable item."""
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(8)] + [("t", 1), ("t", 2)]
    shared = [[1], [2]]  # unhashable items: matched by identity (general path)
    prog = []
    for i in range(n):
        kw = _clauses(rng, names)
        r = rng.random()
        if r < 0.1:
            kw[rng.choice(("mutexinoutset", "inoutset"))] = rng.choice(names)
        elif r < 0.15:
            kw["in_"] = rng.choice(shared)
        elif r < 0.2:
            kw["inout"] = [rng.choice(shared), rng.choice(names)]
        elif r < 0.25:  # found after the plain path linked the hashable ones: taken back
            kw["in_"] = [*rng.sample(names, k=2), rng.choice(shared)]
        elif r < 0.3:
            kw["out"] = [rng.choice(names), rng.choice(shared)]
        elif r < 0.35:
            kw["inout"] = [rng.choice(names), rng.choice(shared)]
        kw["name"] = f"t{i}"
        prog.append(kw)
    return prog


def _build(prog: list[dict], general: bool) -> TaskGraph:
    g = TaskGraph()
    for kw in prog:
        g.add(noop, **kw, **({"after": []} if general else {}))
    return g


def _shape(g: TaskGraph) -> tuple:
    succs = [[s.index for s in t.succs] for t in g.tasks]
    npred = [t.npred for t in g.tasks]

    def idx(v):
        if v is None:
            return None
        if type(v) is list:  # (a task is a list too: of its successors)
            return [t.index for t in v]
        return v.index

    items = {
        repr(k): (st.kind, idx(st.group), idx(st.preds), idx(st.readers))
        for k, st in g.scope.items()
    }
    return succs, npred, items


@pytest.mark.parametrize("seed", range(40))
def test_plain_adds_build_the_graph_the_general_path_builds(seed):
    prog = _program(seed)
    assert _shape(_build(prog, general=False)) == _shape(_build(prog, general=True))


def test_plain_adds_after_a_run_supersede_kept_values():
    # a plain out after a run that kept x's value: the old version is superseded
    g = TaskGraph()
    g.add(lambda: 1, name="w", out="x")
    g.add(lambda x: x + 1, Ref("x"), name="r", out="y")
    assert g.run(workers=1, keep=["x"]).values["x"] == 1
    g.add(lambda: 5, name="w2", out="x")
    g.add(lambda x: x, Ref("x"), name="r2", out="z")
    report = g.run(workers=2, keep=["x", "y", "z"])
    assert report.values == {"x": 5, "y": 2, "z": 5}
    assert [s.name for s in g.tasks[1].succs] == ["w2"]  # the reader before the writer


def test_plain_path_falls_back_for_refs_and_unhashable_items():
    g = TaskGraph()
    arr = [0]
    g.add(lambda: 3, name="w", out="x")
    t = g.add(lambda v: arr.append(v), Ref("x"), name="r", inout=arr)
    g.add(lambda: arr.append(9), name="a", inout=arr)
    assert t.reads is not None and [s.name for s in t.succs] == ["a"]
    g.run(workers=2)
    assert arr == [0, 3, 9]


def test_an_array_given_bare_to_a_clause_is_one_item_matched_by_identity():
    # a clause's value is never compared with (): an array would compare elementwise
    np = pytest.importorskip("numpy")
    a, b = np.zeros(3), np.zeros((2, 2))
    g = TaskGraph()
    g.add(noop, name="w", out=a)
    g.add(noop, name="r", in_=a)
    g.add(noop, name="m", mutexinoutset=b)
    g.add(noop, name="s", inoutset=b, after=())
    g.add(noop, name="w2", inout=a)
    succs = {t.name: [s.name for s in t.succs] for t in g.tasks}
    assert succs == {"w": ["r"], "r": ["w2"], "m": ["s"], "s": [], "w2": []}
    g.run(workers=2)


def test_a_plain_task_has_every_field_a_task_made_by_its_constructor_has():
    # add() makes the plain task without Task.__init__ (the build's hot path): every
    # field must be set, to the same value, as the constructor would
    from dagtrain.taskgraph.task import Task

    g = TaskGraph()
    fast = g.add(noop, 1, name="t", out="x", priority=2, cost=0.5)
    ref = Task(noop, (1,), None, "t", 2, 0.5, 0)
    for field in Task.__slots__:
        assert getattr(fast, field) == getattr(ref, field), field
