"""Dependences inferred by TaskGraph.add: the OpenMP 5.2 table, clause by clause."""

from __future__ import annotations

import pytest

from dagtrain.taskgraph import CycleError, Ref, TaskGraph


def noop(*args, **kwargs):
    return None


def edges(g: TaskGraph) -> set[tuple[str, str]]:
    g.prepare()
    return {(t.name, s.name) for t in g.tasks for s in t.succs}


def reaches(g: TaskGraph, a: str, b: str) -> bool:
    by = {t.name: t for t in g.tasks}
    todo, seen = [by[a]], set()
    while todo:
        t = todo.pop()
        for s in t.succs:
            if s.name == b:
                return True
            if s.name not in seen:
                seen.add(s.name)
                todo.append(s)
    return False


def test_in_waits_for_writers_only():
    #   w(out x) -> r1(in x), r2(in x); readers are not ordered among themselves
    g = TaskGraph()
    g.add(noop, name="w", out="x")
    g.add(noop, name="r1", in_="x")
    g.add(noop, name="r2", in_="x")
    assert edges(g) == {("w", "r1"), ("w", "r2")}


def test_out_waits_for_every_earlier_reader_and_writer():
    #   w1 -> r1, r2 -> w2 (a WAR edge from each reader)
    g = TaskGraph()
    g.add(noop, name="w1", out="x")
    g.add(noop, name="r1", in_="x")
    g.add(noop, name="r2", in_="x")
    g.add(noop, name="w2", inout="x")
    assert edges(g) == {("w1", "r1"), ("w1", "r2"), ("r1", "w2"), ("r2", "w2")}
    assert reaches(g, "w1", "w2")


def test_write_after_write_is_ordered():
    g = TaskGraph()
    g.add(noop, name="a", out="x")
    g.add(noop, name="b", out="x")
    assert edges(g) == {("a", "b")}


def test_reads_before_any_writer_have_no_predecessor():
    g = TaskGraph()
    g.add(noop, name="r", in_="x")
    g.add(noop, name="w", out="x")
    assert edges(g) == {("r", "w")}


@pytest.mark.parametrize("clause", ["mutexinoutset", "inoutset"])
def test_set_members_are_unordered_but_fenced(clause):
    #   w -> {m1, m2, m3} -> r ; members share their predecessors and have no edge between them
    g = TaskGraph()
    g.add(noop, name="w", out="x")
    for i in (1, 2, 3):
        g.add(noop, name=f"m{i}", **{clause: "x"})
    g.add(noop, name="r", in_="x")
    assert edges(g) == {
        ("w", "m1"),
        ("w", "m2"),
        ("w", "m3"),
        ("m1", "r"),
        ("m2", "r"),
        ("m3", "r"),
    }


def test_two_set_kinds_in_a_row_are_ordered():
    g = TaskGraph()
    g.add(noop, name="m1", mutexinoutset="x")
    g.add(noop, name="m2", mutexinoutset="x")
    g.add(noop, name="s1", inoutset="x")
    g.add(noop, name="s2", inoutset="x")
    assert edges(g) == {("m1", "s1"), ("m1", "s2"), ("m2", "s1"), ("m2", "s2")}


def test_a_reader_splits_a_set_in_two():
    g = TaskGraph()
    g.add(noop, name="a", inoutset="x")
    g.add(noop, name="r", in_="x")
    g.add(noop, name="b", inoutset="x")
    assert edges(g) == {("a", "r"), ("r", "b")}


def test_mutexinoutset_tasks_carry_one_shared_mutex():
    g = TaskGraph()
    a = g.add(noop, mutexinoutset="x")
    b = g.add(noop, mutexinoutset=("x", "y"))
    assert a.mutexes[0] is b.mutexes[0]
    assert len(b.mutexes) == 2


def test_item_named_in_two_clauses_is_inout():
    g = TaskGraph()
    g.add(noop, name="r", in_="x")
    g.add(noop, name="rw", in_="x", out="x")
    g.add(noop, name="r2", in_="x")
    assert edges(g) == {("r", "rw"), ("rw", "r2")}


def test_items_may_be_any_hashable_or_object_by_identity():
    buf_a, buf_b = [1], [1]  # equal but distinct, and unhashable
    g = TaskGraph()
    g.add(noop, name="wa", out=[buf_a])
    g.add(noop, name="wb", out=[buf_b])
    g.add(noop, name="ra", in_=[buf_a])
    g.add(noop, name="t", in_=(("layer", 3),))
    assert edges(g) == {("wa", "ra")}


def test_a_string_is_one_item_not_its_characters():
    g = TaskGraph()
    g.add(noop, name="w", out="xy")
    g.add(noop, name="r", in_="x")
    assert edges(g) == set()


def test_after_by_task_and_by_name_including_forward():
    g = TaskGraph()
    a = g.add(noop, name="a")
    g.add(noop, name="b", after=[a, "c"])
    g.add(noop, name="c")
    assert edges(g) == {("a", "b"), ("c", "b")}
    assert [t.name for t in g.topological_order()] == ["a", "c", "b"]


def test_after_unknown_name_is_reported_with_the_task():
    g = TaskGraph()
    g.add(noop, name="b", after="nope")
    with pytest.raises(ValueError, match=r"task 'b': after='nope' names no task"):
        g.prepare()


def test_cycle_error_carries_the_cycle():
    #   a -(x)-> b -(y)-> c, and a after c
    g = TaskGraph()
    g.add(noop, name="a", out="x", after="c")
    g.add(noop, name="b", in_="x", out="y")
    g.add(noop, name="c", in_="y")
    with pytest.raises(CycleError) as info:
        g.run(workers=2)
    cycle = info.value.cycle
    assert isinstance(info.value, ValueError)
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]
    # consecutive names are real edges
    e = edges_unchecked(g)
    assert all((u, v) in e for u, v in zip(cycle, cycle[1:]))


def edges_unchecked(g):
    return {(t.name, s.name) for t in g.tasks for s in t.succs}


def test_self_cycle():
    g = TaskGraph()
    g.add(noop, name="a", after="a")
    with pytest.raises(CycleError, match="a -> a"):
        g.prepare()


def test_bad_arguments_name_the_task():
    g = TaskGraph()
    with pytest.raises(TypeError, match="fn must be callable"):
        g.add(42, name="t")
    with pytest.raises(ValueError, match=r"task 't': cost must be"):
        g.add(noop, name="t", cost=-1)
    with pytest.raises(TypeError, match=r"task 't': after= takes"):
        g.add(noop, name="t", after=3.5)
    with pytest.raises(ValueError, match=r"task 't': Ref\('q'\) reads a value, but no earlier"):
        g.add(noop, Ref("q"), name="t")
    g.add(noop, name="w", out="v")
    with pytest.raises(ValueError, match="declares mutexinoutset"):
        g.add(noop, Ref("v"), name="t", mutexinoutset="v")


def test_default_name_is_the_function_name():
    g = TaskGraph()
    assert g.add(noop).name == "noop"


def test_a_rejected_add_leaves_the_graph_as_it_was():
    g = TaskGraph()
    g.add(noop, name="w", out="x")
    with pytest.raises(TypeError, match="after= takes"):
        g.add(noop, name="bad", in_="x", out="y", after=3.5)
    with pytest.raises(ValueError, match="no earlier task writes"):
        g.add(noop, Ref("nope"), name="bad2", out="x")
    g.add(noop, name="r", in_="x")
    assert edges(g) == {("w", "r")}
    assert [t.name for t in g] == ["w", "r"]


def test_one_event_detaches_one_task():
    from dagtrain.taskgraph import Event

    g = TaskGraph()
    ev = Event()
    g.add(noop, name="a", detach=ev)
    with pytest.raises(ValueError, match="already detaches task 'a'"):
        g.add(noop, name="b", detach=ev)


def test_doctests_in_the_package():
    import doctest

    import dagtrain.taskgraph
    import dagtrain.taskgraph.graph

    for mod in (dagtrain.taskgraph, dagtrain.taskgraph.graph):
        failed, tried = doctest.testmod(mod, extraglobs={"Ref": Ref})
        assert tried > 0 and failed == 0, mod.__name__
