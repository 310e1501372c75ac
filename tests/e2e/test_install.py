"""``pip install airflow-provider-dagtrain`` without extras: what an Airflow scheduler,
api-server or dag-processor gets. The example DAGs parse there, the provider and its
plugin are registered (once), and no torch, MPI or Horovod is installed.

Every command runs outside the checkout: with the checkout as the current directory,
``python -c`` would also find its ``*.egg-info`` (a second copy of the provider)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.slow

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
print(json.dumps({"errors": bag.import_errors, "dags": sorted(bag.dags)}))
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
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", str(REPO / "constraints.txt"), str(src)],
        check=True, timeout=900,
    )  # fmt: skip
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
    venv, env = bare
    for dag_file in sorted((REPO / "dags").glob("*.py")):
        r = subprocess.run(
            [venv / "bin" / "python", "-c", PARSE, str(dag_file)],
            capture_output=True, text=True, env=env, check=False, cwd=venv,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["errors"] == {} and len(got["dags"]) == 1, (dag_file, got)


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
