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
