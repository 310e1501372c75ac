"""Both step kinds declare every member of the protocol the trainer is typed against
(methods on the class or a base, data attributes assigned in ``__init__``)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from dagtrain.training.rank.pipelining import StageStep
from dagtrain.training.rank.protocol import TrainStep
from dagtrain.training.rank.step import StepGraph


def protocol_members() -> set[str]:
    methods = {n for n, v in vars(TrainStep).items() if callable(v) and not n.startswith("_")}
    return methods | set(TrainStep.__annotations__)


def declared(cls: type) -> set[str]:
    """Its public methods (its own or a base's), and every ``self.x`` its ``__init__``
    assigns."""
    names = {
        n
        for c in cls.__mro__[:-1]  # (not object's)
        for n, v in vars(c).items()
        if callable(v) and not n.startswith("_")
    }
    init = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    for node in ast.walk(init):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and getattr(e.value, "id", "") == "self":
                    names.add(e.attr)
    return names


@pytest.mark.parametrize("kind", [StepGraph, StageStep])
def test_each_step_kind_declares_the_whole_protocol(kind):
    missing = protocol_members() - declared(kind)
    assert not missing, f"{kind.__name__} lacks {sorted(missing)}"


def test_the_check_sees_a_missing_member():
    class Partial:
        def __init__(self) -> None:
            self.step = 0

        def run(self) -> None: ...

    assert {"step", "run"} <= declared(Partial)
    assert "guard" in protocol_members() - declared(Partial)
