"""Every docstring example in dagtrain.taskgraph runs and shows what it says."""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
from contextlib import redirect_stdout

import pytest

import dagtrain.taskgraph

PACKAGE = dagtrain.taskgraph.__name__
MODULES = sorted(
    [PACKAGE, *(m.name for m in pkgutil.walk_packages(dagtrain.taskgraph.__path__, PACKAGE + "."))]
)


def run_doctests(name: str) -> doctest.TestResults:
    """doctest.testmod on one module; its report goes into the assertion message."""
    module = importlib.import_module(name)
    out = io.StringIO()
    with redirect_stdout(out):
        result = doctest.testmod(module, report=True)
    assert result.failed == 0, f"{name}: {result.failed} failing examples\n{out.getvalue()}"
    return result


def test_the_walk_finds_the_subpackages():
    assert "dagtrain.taskgraph.graph" in MODULES
    assert "dagtrain.taskgraph.analysis.schedule" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    run_doctests(name)


def test_the_examples_exist():
    """A walk that found nothing, or examples that were all lost, must not pass."""
    tried = {name: run_doctests(name).attempted for name in MODULES}
    assert sum(tried.values()) >= 10, tried
    for name in ("dagtrain.taskgraph", "dagtrain.taskgraph.graph", "dagtrain.taskgraph.task"):
        assert tried[name] > 0, name
