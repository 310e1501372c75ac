"""``pip install airflow-provider-dagtrain`` without extras: what an Airflow scheduler,
api-server or dag-processor gets (installed by uv where the project's venv has it: the
same pins in seconds, ``tests/venvs.py``). The example DAGs parse there, the provider and
its plugin are registered (once), and no torch, MPI or Horovod is installed.

Every command runs outside the checkout: with the checkout as the current directory,
``python -c`` would also find its ``*.egg-info`` (a second copy of the provider)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import venvs

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.slow

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
got = {}
for path in sys.argv[1:]:
    bag = DagBag(path)
    got[path] = {"errors": bag.import_errors, "dags": sorted(bag.dags)}
print(json.dumps(got))
"""
PLUGINS = """
import json
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"plugins": [p.name for p in plugins], "errors": errors}))
"""


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy: pip builds in the source tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "dagtrain", src / "dagtrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    venv = tmp / "venv"
    got = venvs.build(venv, ["-c", str(REPO / "constraints.txt"), str(src)], timeout=900)
    assert got.returncode == 0, got.stderr[-3000:]
    home = tmp / "airflow"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    return venv, env


def test_no_training_dependency_is_installed(bare):
    venv, _ = bare
    code = "import importlib.util as u; print([m for m in ('torch', 'mpi4py', 'horovod', "
    code += "'sklearn') if u.find_spec(m)])"
    out = subprocess.run(
        [venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=False,
        cwd=venv,
    )  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_example_dags_parse_without_the_train_extra(bare):
    """Each file by its own DagBag, all in one process (an interpreter importing Airflow
    costs seconds: one for all the files, as a dag-processor parses them)."""
    venv, env = bare
    files = [str(f) for f in sorted((REPO / "dags").glob("*.py"))]
    r = subprocess.run(
        [venv / "bin" / "python", "-c", PARSE, *files],
        capture_output=True, text=True, env=env, check=False, cwd=venv,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(got) == files and len(files) >= 4, got
    for dag_file, parsed in got.items():
        assert parsed["errors"] == {} and len(parsed["dags"]) == 1, (dag_file, parsed)


def test_airflow_lists_the_provider_and_loads_the_plugin_once(bare):
    venv, env = bare
    r = subprocess.run(
        [venv / "bin" / "airflow", "providers", "list", "--output", "json"],
        capture_output=True, text=True, env=env, check=False, cwd=venv,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "airflow-provider-dagtrain" in r.stdout, r.stdout
    for lazy in ("True", "False"):
        r = subprocess.run(
            [venv / "bin" / "python", "-c", PLUGINS],
            capture_output=True, text=True, check=False, cwd=venv,
            env={**env, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["plugins"].count("dagtrain") == 1 and got["errors"] == {}, (lazy, got)
