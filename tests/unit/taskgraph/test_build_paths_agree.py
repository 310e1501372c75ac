"""The plain path of ``TaskGraph.add`` builds the graph the general path builds, and a
task is the list of its successors: the same graph for any program, what the plain
path linked taken back when it meets an unhashable item (or one whose hash raises), a
wide add linear in its items, and a task that compares, orders and serialises as the
Task docstring says.

The reference is the general path, ``deps.build_task`` (``after=[]`` forces it): the
same successors in the same order, the same npred, the same per-item state. Every
graph here is built twice, in lockstep, and compared.
"""

from __future__ import annotations

import json
import random

import pytest

from dagtrain.taskgraph import Ref, TaskGraph, TaskTimeoutError
from dagtrain.taskgraph.task import Item, Task


def noop(*args, **kwargs):
    return None


# ------------------------------------------------------------------ helpers


def _idx(v):
    if v is None:
        return None
    if type(v) is list:
        return [t.index for t in v]
    return v.index


def _key(k):
    # an unhashable item's key is an IdKey (general path); a task item names its index
    return repr(k)


def shape(g: TaskGraph) -> tuple:
    succs = [[s.index for s in t] for t in g.tasks]
    copies = [[s.index for s in t.succs] for t in g.tasks]
    assert succs == copies
    npred = [t.npred for t in g.tasks]
    items = {
        _key(k): (
            st.kind,
            _idx(st.group),
            _idx(st.preds),
            _idx(st.readers),
            None if st.slot is None else (st.slot.current, st.slot.keep, st.slot.readers),
        )
        for k, st in g.scope.items()
    }
    keys = sorted(
        _key(k) for k in g.scope
    )  # (order: see test_values_do_not_depend_on_the_path_that_built_the_graph)
    slots = [(repr(s.item), s.current, s.keep, s.readers) for s in g.slots]
    pubs = [None if t.publishes is None else [repr(s.item) for s in t.publishes] for t in g.tasks]
    return succs, npred, items, keys, slots, pubs


class Twin:
    """The same program built by the plain path (fast) and by build_task (ref)."""

    def __init__(self) -> None:
        self.fast = TaskGraph("fast")
        self.ref = TaskGraph("ref")

    def add(self, *args, **kw):
        def resolve(g, v):
            # ("task", k) names the k-th task of each graph (a task as a data item)
            if _is_marker(v):
                return g.tasks[v[1]]
            if type(v) in (list, tuple) and any(map(_is_marker, v)):
                return type(v)(resolve(g, x) for x in v)
            return v  # (the same object: an unhashable one is matched by identity)

        out = []
        for g, general in ((self.fast, False), (self.ref, True)):
            kw2 = {k: resolve(g, v) for k, v in kw.items()}
            if general and "after" not in kw2:
                kw2["after"] = []
            out.append(g.add(noop, *args, **kw2))
        return out

    def check(self):
        assert shape(self.fast) == shape(self.ref)


# ------------------------------------------------------------------ the fuzz


def _is_marker(v) -> bool:
    return type(v) is tuple and len(v) == 2 and v[0] == "task#"


def _as_list(v) -> list:
    if v is None:
        return []
    if type(v) in (list, set) or (type(v) is tuple and not _is_marker(v)):
        return list(v)
    return [v]


def _fuzz(seed: int, n: int = 160) -> None:
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(6)] + [("t", 1)]
    lists = [[1], [2], [3]]  # unhashable: by identity
    utup = ("u", lists[0])  # an unhashable tuple item (one item, by identity)
    tw = Twin()
    kinds: dict = {}  # name -> the reference's kind after each add (for Ref)

    def pick(k: int) -> list:
        got = rng.sample(names, k=k)
        if rng.random() < 0.25 and len(tw.ref.tasks) > 0:  # a task as an item
            got.append(("task#", rng.randrange(len(tw.ref.tasks))))
        return got

    def shaped(picked: list):
        s = rng.randrange(5)
        if s == 0 and len(picked) == 1:
            return picked[0]
        if s == 1:
            return picked
        if s == 2:
            return (*picked, picked[0])  # a duplicate
        if s == 3 and not any(type(p) is tuple and p[0] == "task#" for p in picked):
            return set(picked)
        return list(picked)

    for i in range(n):
        kw: dict = {}
        for clause in ("in_", "out", "inout"):
            if rng.random() < 0.45:
                kw[clause] = shaped(pick(rng.randint(1, 3)))
        r = rng.random()
        bad = rng.choice([*lists, utup])
        if r < 0.3:  # an unhashable item in some position of some clause
            clause = rng.choice(("in_", "out", "inout"))
            cur = _as_list(kw.get(clause))
            cur.insert(rng.randint(0, len(cur)), bad)
            if rng.random() < 0.3:
                cur.append(bad)  # twice
            kw[clause] = cur if rng.random() < 0.5 else tuple(cur)
            if rng.random() < 0.3:  # and the same item read and written
                other = rng.choice([c for c in ("in_", "out", "inout") if c != clause])
                kw[other] = [*_as_list(kw.get(other)), bad]
        elif r < 0.35:
            kw[rng.choice(("mutexinoutset", "inoutset"))] = rng.choice(names)
        elif r < 0.4 and i:
            kw["after"] = f"n{rng.randrange(i)}"
        # a Ref on a name last written with out/inout (the general path in both graphs)
        args = ()
        written = [nm for nm in names if kinds.get(nm) == 1]
        if written and rng.random() < 0.1:
            args = (Ref(rng.choice(written)),)
            kw.pop("mutexinoutset", None)
            kw.pop("inoutset", None)
        kw["name"] = f"n{i}"
        tw.add(*args, **kw)
        kinds = {k: st.kind for k, st in tw.ref.scope.items() if not repr(k).startswith("<")}
        if rng.random() < 0.03:  # a run in between, keeping some values
            keep = [nm for nm in names if kinds.get(nm) == 1][:2]
            for g in (tw.fast, tw.ref):
                g.run(workers=rng.choice((1, 2)), keep=keep)
            tw.check()
    tw.check()
    for g in (tw.fast, tw.ref):
        rep = g.run(workers=2)
        assert all(s == "done" for s in rep.states)


@pytest.mark.parametrize("seed", range(30))
def test_fuzz_plain_and_general_paths_build_the_same_graph(seed):
    _fuzz(seed)


# -------------------------------------------- rollback of an unhashable item


def _base(tw: Twin) -> None:
    tw.add(name="w", out=["x", "y"])  # x, y: written
    tw.add(name="r1", in_="x")  # x has a reader since its writer
    tw.add(name="m", mutexinoutset="z")  # z: a set
    tw.add(name="s", inoutset="z2")
    tw.add(name="r0", in_="fresh-read")  # an item with readers and no writer


BAD = [0]

CASES = {
    "in_ last": dict(in_=["x", "y", "z", "fresh-read", "new", BAD]),
    "in_ first": dict(in_=[BAD, "x", "y"]),
    "in_ middle, tuple": dict(in_=("x", BAD, "new")),
    "in_ bare": dict(in_=BAD, out="x"),
    "in_ twice, dup names": dict(in_=["x", "x", "new", "new", BAD, BAD]),
    "out last": dict(out=["x", "z", "z2", "new", BAD]),
    "out first": dict(out=[BAD, "x"]),
    "out tuple with reads": dict(out=("x", "new", BAD), in_=["y", "new2", "z"]),
    "inout last": dict(inout=["y", "fresh-read", BAD]),
    "inout with out and in": dict(out=["x"], inout=["x", "y", BAD], in_=["x", "y", "z"]),
    "read and written, bad in in_": dict(out=["x", "new"], in_=["x", "new", "y", BAD]),
    "bad both read and written": dict(out=["x", BAD], in_=[BAD, "y"]),
    "out and inout same, bad in inout": dict(out=["x", "y"], inout=["y", "x", BAD]),
    "set clause on other item": dict(in_=["x", BAD], out="y"),
    "all new": dict(in_=["a1", "a2", BAD], out=["b1"], inout=["c1"]),
    "bad tuple item": dict(in_=["x", ("t", [1])], out="y"),
    "dict item": dict(in_={"k": 1}, out=["x", "y"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unhashable_item_anywhere_is_taken_back(case):
    tw = Twin()
    _base(tw)
    tw.check()
    tw.add(name="t", **CASES[case])
    tw.check()
    # and the graph keeps working: a later plain add through every item
    tw.add(name="after", inout=["x", "y", "z", "z2", "new", "fresh-read", "a1"])
    tw.add(name="after2", in_=BAD)
    tw.check()
    for g in (tw.fast, tw.ref):
        assert all(s == "done" for s in g.run(workers=2).states)


def test_rollback_after_a_run_with_ref_slots_and_keep():
    tw = Twin()
    tw.add(name="w", out="x")
    tw.fast.add(lambda x: x, Ref("x"), name="r", out="y")
    tw.ref.add(lambda x: x, Ref("x"), name="r", out="y")
    for g in (tw.fast, tw.ref):
        assert g.run(workers=1, keep=["x", "y"]).values == {"x": None, "y": None}
    tw.check()
    tw.add(name="t", out=["x", BAD], in_="y")  # supersedes x's kept version: not yet
    tw.check()
    assert tw.fast.scope["x"].group.name == "t"
    assert tw.fast.scope["x"].slot is None  # superseded once, by build_task
    for g in (tw.fast, tw.ref):
        g.run(workers=2, keep=["y"])
    tw.check()


def test_rollback_leaves_no_link_to_the_discarded_task():
    g = TaskGraph()
    w = g.add(noop, name="w", out="x")
    r = g.add(noop, name="r", in_="y")
    t = g.add(noop, name="t", out=["x"], in_=["y", "new", BAD])
    assert [s.name for s in w] == ["t"] and len(w) == 1
    assert r.succs == []  # a reader is no predecessor of another reader
    assert [x.name for x in g.scope["y"]] == ["r", "t"]
    assert [x.name for x in g.scope["new"]] == ["t"]
    assert t.npred == 1 and g.tasks == [w, r, t]
    for st in g.scope.values():
        for x in (*st, *(st.group if type(st.group) is list else [st.group])):
            assert x is None or x in g.tasks  # no trace of the plain path's task


# ------------------------------------------- an exception other than TypeError


class HashFails:
    """A data item whose hash raises something else than TypeError (a lazy handle, a
    proxy whose target is gone, ...)."""

    def __hash__(self):
        raise RuntimeError("no hash yet")


def test_an_add_whose_item_hash_raises_leaves_the_graph_as_it_was():
    # add() must raise and leave the graph as it was (build_task checks before it
    # changes anything). The plain path links predecessors and joins readers as it
    # goes, so it takes them back whatever the hash raises, not only TypeError: else
    # w would keep a successor that is in no graph, and x a phantom reader.
    tw = Twin()
    tw.add(name="w", out="x")
    for g, general in ((tw.fast, False), (tw.ref, True)):
        with pytest.raises(RuntimeError):
            g.add(noop, name="bad", in_=["x", HashFails()], **({"after": []} if general else {}))
    assert tw.ref.tasks[0].succs == []  # the reference: untouched
    assert tw.fast.tasks[0].succs == [], "w has a successor that is not in the graph"
    tw.check()


def test_a_failed_add_leaves_no_phantom_reader_for_the_next_writer():
    # (a phantom reader of x would make its next writer wait for a task that is not
    # in g.tasks and never runs: the run could only time out)
    g = TaskGraph()
    g.add(noop, name="w", out="x")
    with pytest.raises(RuntimeError):
        g.add(noop, name="bad", in_=["x", HashFails()])
    w2 = g.add(noop, name="w2", out="x")
    assert [p.name for p in g.tasks if w2 in p] == ["w"], "w2 waits for a task not in g"
    try:
        g.run(workers=1, timeout=3.0)
    except TaskTimeoutError:  # pragma: no cover - only with a phantom reader
        pytest.fail("w2 never ran: its predecessor is the failed add's task")


def test_unwire_plain_takes_back_every_link_when_a_later_item_hash_raises():
    # out is wired first (y's writer gets the task), the list raises TypeError, and
    # unwire_plain meets the in_ item whose hash raises (it walks in_ first): it must
    # go on and take back y's link, whatever that hash raised.
    tw = Twin()
    tw.add(name="w", out="y")
    for g, general in ((tw.fast, False), (tw.ref, True)):
        with pytest.raises(RuntimeError):
            g.add(
                noop,
                name="bad",
                out=["y", [0]],
                in_=HashFails(),
                **({"after": []} if general else {}),
            )
    tw.check()


# ------------------------------------------------------------- cost of a wide add


def test_a_wide_add_is_linear_in_its_items(monkeypatch):
    # the written items are a set (identity): `st in` a list of them for each item
    # read would make O(reads x writes) rich comparisons of Items per add (~90,000
    # here), where build_task is O(items).
    calls = [0]

    def eq(a, b):
        calls[0] += 1
        return True if a is b else NotImplemented

    g = TaskGraph()
    reads = [f"r{i}" for i in range(300)]
    writes = [f"w{i}" for i in range(300)]
    g.add(noop, name="init", out=reads + writes)
    monkeypatch.setattr(Item, "__eq__", eq)
    g.add(noop, name="wide", in_=reads, out=writes)
    monkeypatch.undo()
    assert calls[0] <= 4 * (len(reads) + len(writes)), f"{calls[0]} Item comparisons"


# ---------------------------------------------- equal keys of different objects


def test_an_item_read_and_written_under_equal_keys_is_one_item():
    # in_=1.0 and out=1 name one item (dict semantics). build_task keys it by the first
    # name it meets (1.0), the plain path by the written one (1): the same item, the
    # same state, another (equal) key object in g.scope.
    tw = Twin()
    tw.add(name="a", in_=1.0, out=1)
    tw.add(name="b", in_=True, inout=[1])
    assert list(tw.fast.scope) == list(tw.ref.scope) == [1]
    assert [t.npred for t in tw.fast.tasks] == [t.npred for t in tw.ref.tasks] == [0, 1]


def test_values_do_not_depend_on_the_path_that_built_the_graph():
    # the plain path makes new written items before new read ones (build_task: in_
    # first), so g.scope's order may differ; the values a run reports do not
    vals = []
    for general in (False, True):
        g = TaskGraph()
        extra = {"after": []} if general else {}
        g.add(noop, name="t", in_="a", out="b", **extra)
        g.add(lambda: 1, name="wa", out="a", **extra)
        g.start(workers=1)
        g.add(noop, Ref("a"), Ref("b"), name="r")  # both pinned versions are read
        g.join()
        vals.append(g.run(workers=1, keep=["b", "a"]).values)
        assert sorted(map(repr, g.scope)) == ["'a'", "'b'"]
    assert vals[0] == vals[1] == {"a": 1, "b": None}


# ------------------------------------------------------ a task is a list: API


def test_a_task_never_equals_a_plain_list():
    # "Tasks compare and hash by identity" (Task docstring): object.__eq__ would
    # return NotImplemented for another object, and Python fall back to list.__eq__
    # with the operands swapped, comparing contents
    g = TaskGraph()
    a = g.add(noop, name="a", out="x")
    assert (a == []) is False, "a task with no successors equals []"
    assert ([] == a) is False  # noqa: SIM300 (the reflected comparison)
    b = g.add(noop, name="b", in_="x")
    assert (a == [b]) is False and (a == a.succs) is False and a != a.succs
    assert [[]].count(b) == 0  # a task is not found among plain lists


def test_a_task_does_not_order_against_a_list():
    # "...and do not order": between tasks, and against a list
    g = TaskGraph()
    a = g.add(noop, name="a")
    with pytest.raises(TypeError):
        sorted([a, g.add(noop, name="b")])
    with pytest.raises(TypeError):
        a < [1]  # noqa: B015


def test_json_writes_a_task_as_its_successors():
    # pinned: a task is a list, so json.dumps writes it as nested lists of its
    # successors (exponential in a diamond-rich graph). Nothing in dagtrain serialises
    # tasks; docs/taskgraph.md says a task is its successor list.
    g = TaskGraph()
    a = g.add(noop, name="a", out="x")
    g.add(noop, name="b", in_="x")
    assert json.dumps(a) == "[[]]"


# --------------------------------- tasks as items and after= targets, runs, analysis


def test_task_as_a_clause_item_and_after_target():
    tw = Twin()
    t0, _ = tw.add(name="t0")  # no successors: len 0, still truthy
    assert t0 and len(t0) == 0 and bool(t0) is True
    tw.add(name="a", out=("task#", 0))  # out=task: one item (hashable, by identity)
    tw.add(name="b", in_=[("task#", 0), "x"])
    tw.add(name="c", inout=[("task#", 0), [5]])  # with an unhashable: rollback
    tw.check()
    for g in (tw.fast, tw.ref):
        t = g.tasks[0]
        assert t in g.scope and [s.name for s in g.scope[t]] == []
        c = g.add(noop, name="d", after=t)  # a task with no successors is no empty clause
        assert c.npred == 1 and [s.name for s in t] == ["d"]
        g.add(noop, name="e", after=[g.tasks[1]], in_=g.tasks[1])
        assert [s.name for s in g.tasks[1]] == ["b", "e"]
    tw.check()


def test_succs_is_a_read_only_copy():
    g = TaskGraph()
    a = g.add(noop, name="a", out="x")
    b = g.add(noop, name="b", in_="x")
    s = a.succs
    s.append(a)
    assert a.succs == [b] and s is not a.succs and type(a.succs) is list
    with pytest.raises(AttributeError):
        a.succs = []


def test_runtime_trace_and_analysis_agree_on_both_builds(tmp_path):
    tw = Twin()
    rng = random.Random(7)
    arr = [9]
    for i in range(60):
        tw.add(
            name=f"t{i}",
            cost=rng.choice((1.0, 2.0, 3.0)),
            in_=rng.sample(["a", "b", "c", "d"], 2),
            out=rng.choice(["a", "b", "c", "d", [arr]]),
        )
    tw.check()
    cps = [[t.index for t in g.critical_path()[0]] for g in (tw.fast, tw.ref)]
    assert cps[0] == cps[1] and len(cps[0]) > 1
    assert [t.index for t in tw.fast.topological_order()] == [
        t.index for t in tw.ref.topological_order()
    ]
    plans = [g.schedule(workers=2).makespan for g in (tw.fast, tw.ref)]
    assert plans[0] == plans[1]
    afters = []
    for g in (tw.fast, tw.ref):
        p = tmp_path / f"{g.name}.json"
        g.run(workers=2, trace=str(p))
        ev = json.loads(p.read_text())["traceEvents"]
        xs = [(e["args"]["index"], e["args"].get("after")) for e in ev if e["ph"] == "X"]
        afters.append(sorted(xs, key=lambda x: x[0]))
    assert afters[0] == afters[1]


def test_inline_first_run_and_replay_respect_edges():
    g = TaskGraph()
    seen: list = []
    for i in range(200):
        g.add(seen.append, i, name=f"t{i}", inout=f"v{i % 7}", in_=f"v{(i + 3) % 7}")
    for _ in range(2):  # probe run, then the replay (inline)
        seen.clear()
        g.run(workers=2)
        pos = {v: k for k, v in enumerate(seen)}
        for t in g.tasks:
            for s in t:
                assert pos[t.args[0]] < pos[s.args[0]]


def test_a_dynamic_add_after_a_plain_build_links_through_the_task_list():
    g = TaskGraph()
    w = g.add(noop, name="w", out="x")
    g.start(workers=2)
    r = g.add(noop, name="r", in_="x")  # while running: build_task + Run.add
    g.join()
    assert w.succs == [r] and r.npred == 1
    w2 = g.add(noop, name="w2", out="x")  # plain again after join: waits for r
    assert r.succs == [w2] and w.succs == [r] and w2.npred == 1
    assert all(s == "done" for s in g.run(workers=2).states)


def test_a_plain_task_made_in_add_has_the_constructors_fields():
    g = TaskGraph()
    fast = g.add(noop, name="t", out="x")
    ref = Task(noop, (), None, "t", 0, None, 0)
    for f in Task.__slots__:
        assert getattr(fast, f) == getattr(ref, f), f
    assert list(fast) == list(ref) == []
