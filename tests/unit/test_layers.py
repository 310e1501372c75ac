"""The layers import downward only, and the package layout says so.

    taskgraph      sync      launch        (base: atomic, changes, config, errors, rank_env,
                                            records, tracking)
          \\         |        /
               training
                  |
               phases
                  |
     operators / pipelines / plugins / cli

Every ``import`` statement counts, at any depth (the lazy ones inside functions too):
a layer that imports an upper one only later is still tangled with it. Every part of
the package is listed: a new module or package must say what it may import.
"""

from __future__ import annotations

import ast
import graphlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "dagtrain"
BASE = {
    "dagtrain.atomic",
    "dagtrain.changes",
    "dagtrain.config",
    "dagtrain.errors",
    "dagtrain.rank_env",
    "dagtrain.records",
    "dagtrain.redact",
    "dagtrain.tracking",
}
# what each part may import of dagtrain, besides itself (a module's full name where only
# that module of a part is allowed)
ALLOWED = {
    "dagtrain.atomic": set(),
    "dagtrain.changes": set(),
    "dagtrain.errors": set(),
    "dagtrain.redact": set(),
    # what one part writes and another reads: the layout, file names, typed records
    "dagtrain.records": {"dagtrain.atomic", "dagtrain.config"},
    "dagtrain.rank_env": {
        "dagtrain.atomic",
        "dagtrain.errors",
        "dagtrain.records.names",
        "dagtrain.records.status",
    },
    "dagtrain.config": {"dagtrain.errors", "dagtrain.redact"},
    # MLflow (optional): the stages' logging and the records the training page reads
    "dagtrain.tracking": {
        "dagtrain.atomic",
        "dagtrain.config",
        "dagtrain.errors",
        "dagtrain.records",
        "dagtrain.redact",
    },
    "dagtrain.taskgraph": {"dagtrain.atomic"},
    "dagtrain.sync": BASE | {"dagtrain.taskgraph"},
    "dagtrain.launch": BASE,
    "dagtrain.training": BASE | {"dagtrain.taskgraph", "dagtrain.sync", "dagtrain.launch"},
    "dagtrain.phases": BASE | {"dagtrain.training", "dagtrain.launch"},
    # operators only translate: Airflow's context to a stage call; their extra links
    "dagtrain.operators": {
        "dagtrain.config",
        "dagtrain.errors",
        "dagtrain.phases",
        "dagtrain.plugins.links",
        "dagtrain.tracking",
    },
    "dagtrain.pipelines": {"dagtrain.config", "dagtrain.operators", "dagtrain.records.layout"},
    "dagtrain.plugins": BASE | {"dagtrain.phases"},
    "dagtrain.cli": BASE
    | {"dagtrain", "dagtrain.docs", "dagtrain.sync", "dagtrain.phases", "dagtrain.plugins"},
    "dagtrain.docs": {"dagtrain.config"},
    "dagtrain.get_provider_info": set(),
    "dagtrain.__main__": {"dagtrain.cli"},
    "dagtrain.__init__": set(),
}


def part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports_of(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every dagtrain module ``path`` names in an import statement, relative ones resolved."""
    rel = path.relative_to(package.parent).with_suffix("")
    here = list(rel.parts if rel.name != "__init__" else rel.parts[:-1])
    if rel.name == "__init__":
        here.append("__init__")  # a package's own level-1 imports are its children
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            else:
                # ``from dagtrain import redact`` imports the module dagtrain.redact
                mod = node.module or ""
                for a in node.names:
                    sub = package.parent.joinpath(*mod.split("."), a.name)
                    child = sub.with_suffix(".py").is_file() or sub.is_dir()
                    found.add(f"{mod}.{a.name}" if child else mod)
    return {m for m in found if m == "dagtrain" or m.startswith("dagtrain.")}


def package_copy(tmp_path: Path) -> Path:
    """A copy of the package's code to plant an import in: each checker must fail."""
    copy = tmp_path / "dagtrain"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "static"))
    return copy


def forbidden_edges(package: Path = PACKAGE) -> list[str]:
    """Every import of a part that its entry in ALLOWED does not allow, and every module
    of a part ALLOWED does not list."""
    wrong = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        me = part(".".join(rel.parts))
        if me not in ALLOWED:
            wrong.append(f"{path.relative_to(package.parent)}: a part the layer test does not list")
            continue
        for m in imports_of(path, package):
            if part(m) != me and part(m) not in ALLOWED[me] and m not in ALLOWED[me]:
                wrong.append(f"{path.relative_to(package.parent)} imports {m}")
    return wrong


def test_each_layer_imports_only_what_is_below_it():
    wrong = forbidden_edges()
    assert not wrong, "\n".join(wrong)


def test_a_forbidden_edge_fails_the_layer_test(tmp_path):
    # a copy of the package with one upward import planted in an operator, one in the
    # executor and one new part nobody listed: each is reported
    copy = package_copy(tmp_path)
    assert forbidden_edges(copy) == []
    with open(copy / "operators" / "train.py", "a") as f:
        f.write("\ndef _planted():\n    from dagtrain.training.rank import checkpoint\n")
    with open(copy / "taskgraph" / "graph.py", "a") as f:
        f.write("\nfrom dagtrain.config import PipelineConfig\n")
    (copy / "newpart.py").write_text("import dagtrain.cli\n")
    assert forbidden_edges(copy) == [
        "dagtrain/newpart.py: a part the layer test does not list",
        "dagtrain/operators/train.py imports dagtrain.training.rank.checkpoint",
        "dagtrain/taskgraph/graph.py imports dagtrain.config",
    ]


def test_the_checker_sees_relative_and_lazy_imports(tmp_path):
    # the test above must be able to fail: a planted upward import is found
    found = imports_of(PACKAGE / "training" / "driver" / "job.py")
    assert {"dagtrain.launch", "dagtrain.config"} <= found
    found = imports_of(PACKAGE / "operators" / "train.py")
    assert "dagtrain.phases.train" in found  # imported inside execute()
    assert "dagtrain.operators._base" in found  # a relative import


def loaded_after(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    ("module", "never"),
    [
        ("dagtrain.taskgraph", ("dagtrain.config", "dagtrain.errors", "dagtrain.sync")),
        ("dagtrain.launch", ("dagtrain.training", "torch", "mpi4py", "airflow")),
        ("dagtrain.config", ("torch", "numpy", "airflow", "dagtrain.training")),
        ("dagtrain.training", ("airflow", "dagtrain.operators", "dagtrain.cli")),
        ("dagtrain.training.driver.job", ("airflow", "dagtrain.phases", "dagtrain.pipelines")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(module, never):
    loaded = loaded_after(module)
    bad = {m for m in loaded for n in never if m == n or m.startswith(n + ".")}
    assert not bad, (module, sorted(bad))


def test_the_work_behind_the_operators_and_the_dag_builders_have_distinct_names():
    names = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    # no two top-level names one letter apart (pipeline/ next to pipelines.py was)
    close = [(a, b) for a in names for b in names if a < b and (a + "s" == b or b + "s" == a)]
    assert not close, close
    assert (PACKAGE / "cli" / "embedded.py").exists() and (PACKAGE / "cli" / "rest.py").exists()


def private_imports(package: Path = PACKAGE) -> list[str]:
    """Every ``from module import _name`` of a private name (not a module) of another
    module: what crosses modules has a public name."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            where = path.parent
            for _ in range(max(node.level - 1, 0)):
                where = where.parent
            base = where if node.level else package.parent
            mod = base.joinpath(*(node.module or "").split(".")) if node.module else base
            for a in node.names:
                sub = mod / a.name
                module = sub.with_suffix(".py").is_file() or sub.is_dir()
                if a.name.startswith("_") and not a.name.startswith("__") and not module:
                    rel = path.relative_to(package.parent)
                    found.append(f"{rel} imports {a.name} from {'.' * node.level}{node.module}")
    return found


def test_no_module_imports_another_modules_private_names(tmp_path):
    assert private_imports() == []
    # and the check can fail: a planted private import is found, a private module is not
    copy = package_copy(tmp_path)
    with open(copy / "cli" / "run.py", "a") as f:
        f.write("\nfrom .rest import _planted\nfrom dagtrain.operators import _base\n")
    assert private_imports(copy) == ["dagtrain/cli/run.py imports _planted from .rest"]


def test_the_architecture_page_names_every_module():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    modules = [
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    ]
    missing = [m for m in modules if f"`{m}`" not in page]
    assert not missing, f"docs/architecture.md does not name {missing}"


def runtime_imports(path: Path, package: Path = PACKAGE) -> tuple[str, set[str]]:
    """A module's name and the dagtrain modules it imports when it runs: every import
    statement at any depth but those under ``if TYPE_CHECKING:``; ``from pkg import
    name`` counts as the module ``pkg.name`` where that is a module."""
    rel = path.relative_to(package.parent).with_suffix("")
    me = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    pkg = me.split(".") if rel.name == "__init__" else me.split(".")[:-1]
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for b in node.body for n in ast.walk(b)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join([*pkg[: len(pkg) - node.level + 1], *([mod] if mod else [])])
            for a in node.names:
                sub = package.parent.joinpath(*mod.split("."), a.name)
                child = sub.with_suffix(".py").is_file() or sub.is_dir()
                found.add(f"{mod}.{a.name}" if child else mod)
    return me, {m for m in found if m.split(".")[0] == "dagtrain" and m != me}


def import_cycle(package: Path = PACKAGE) -> list[str]:
    """A cycle of modules that import each other when they run (empty: none)."""
    graph = dict(runtime_imports(p, package) for p in sorted(package.rglob("*.py")))
    try:
        graphlib.TopologicalSorter({m: deps & graph.keys() for m, deps in graph.items()}).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_two_modules_import_each_other(tmp_path):
    # the executor's modules included (graph, runtime, inline, nesting, analysis): each
    # imports only modules below it, the others' names only for type checking
    assert import_cycle() == []
    copy = package_copy(tmp_path)
    with open(copy / "taskgraph" / "inline.py", "a") as f:
        f.write("\ndef _planted():\n    from . import graph\n")
    assert set(import_cycle(copy)) >= {"dagtrain.taskgraph.inline", "dagtrain.taskgraph.graph"}


def test_what_runs_inside_a_rank_never_imports_what_starts_ranks():
    rank = PACKAGE / "training" / "rank"
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {m}"
        for path in sorted(rank.rglob("*.py"))
        for m in runtime_imports(path)[1]
        if m.startswith("dagtrain.training.driver")
    ]
    assert not wrong, "\n".join(wrong)
    # and the two rooms hold every module of training/ but its two entry points
    loose = {p.name for p in (PACKAGE / "training").glob("*.py")}
    assert loose == {"__init__.py", "__main__.py"}, loose
