"""Nothing heavy at import: Airflow parses DAG files every few seconds."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "horovod", "mpi4py", "airflow", "numpy")


def imported_after(module: str) -> set[str]:
    code = (
        f"import sys, json; import {module}; "
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return set(json.loads(out))


def test_taskgraph_imports_only_the_standard_library():
    mods = imported_after("dagtrain.taskgraph")
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_package_root_is_light():
    assert not imported_after("dagtrain") & set(HEAVY)


def test_sync_and_launch_import_no_torch_nor_mpi():
    for mod in ("dagtrain.sync", "dagtrain.launch"):
        assert not imported_after(mod) & set(HEAVY), mod


DEEP = ("torch", "horovod", "mpi4py", "mlflow")


def test_operator_modules_and_config_import_no_torch_nor_mpi():
    for mod in (
        "dagtrain.config",
        "dagtrain.operators",
        "dagtrain.pipelines",
        "dagtrain.plugins",
        "dagtrain.get_provider_info",
        "dagtrain.cli",
    ):
        assert not imported_after(mod) & set(DEEP), mod


def test_every_example_dag_imports_cleanly_and_without_torch_horovod_or_mpi(tmp_path):
    """Each file in dags/ parsed by Airflow's own DagBag, in a fresh interpreter."""
    from pathlib import Path

    dags = sorted(Path(__file__).parents[2].joinpath("dags").glob("*.py"))
    assert len(dags) >= 3
    code = (
        "import sys, json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "bag = DagBag(sys.argv[1])\n"
        "print(json.dumps({'errors': {k: v for k, v in bag.import_errors.items()},\n"
        "  'dags': sorted(bag.dags),\n"
        "  'heavy': sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[2:]))}))\n"
    )
    env = {
        **__import__("os").environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/a.db",
    }
    for dag_file in dags:
        r = subprocess.run(
            [sys.executable, "-c", code, str(dag_file), *DEEP],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["errors"] == {}, got["errors"]
        assert len(got["dags"]) == 1, (dag_file, got["dags"])
        assert got["heavy"] == [], (dag_file, got["heavy"])
