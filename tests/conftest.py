"""Test session setup: Airflow, when a test imports it in-process, gets a home of its own
(not ~/airflow), with no example DAGs and a throwaway SQLite database."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_home = tempfile.mkdtemp(prefix="dagtrain-test-airflow-")
atexit.register(shutil.rmtree, _home, ignore_errors=True)
# set, not defaulted: a developer's own AIRFLOW_HOME must never see the tests
os.environ["AIRFLOW_HOME"] = _home
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"


# Where make test's first run (pytest-xdist, --dist loadgroup) puts tests that share an
# expensive fixture: one group runs on one worker, so the fixture is made once. The
# rest are handed out one test at a time.
GROUPS = {
    # the session's Airflow (tests/airflow/conftest.py): dagtrain run, then dagtrain up
    "tests/airflow/test_logs.py": "airflow",
    "tests/airflow/test_page.py": "airflow",
    "tests/airflow/test_rest.py": "airflow",
    "tests/airflow/test_trigger.py": "airflow",
    "tests/e2e/test_install.py": "install",  # one venv without extras
    "tests/integration/test_mlflow.py": "mlflow",  # one MLflow server
    "tests/integration/test_pipelining.py": "pipeline",  # one single-process reference
    "tests/multihost/": "multihost",  # one cluster (PostgreSQL, Redis, Celery, hosts)
    "tests/unit/plugins/test_page_in_browser.py": "browser",  # one Chromium
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The full pipeline-parallel grid runs only when asked (``-m pipeline_grid``); the
    tests of a GROUPS entry share an xdist group."""
    for item in items:
        path = item.nodeid.split("::")[0]
        for prefix, group in GROUPS.items():
            if path.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))
    if "pipeline_grid" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full pipeline grid: pytest -m pipeline_grid")
    for item in items:
        if "pipeline_grid" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path, removed after the test: the ``TMPDIR`` of a
    launcher a test SIGKILLs, which cannot remove its own temporary folders (mpirun's
    PMIx puts its sockets in it, and a socket's path may not pass 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="dt-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
