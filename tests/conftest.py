"""Test session setup: Airflow, when a test imports it in-process, gets a home of its own
(not ~/airflow), with no example DAGs and a throwaway SQLite database."""

from __future__ import annotations

import os
import tempfile

_home = tempfile.mkdtemp(prefix="dagtrain-test-airflow-")
# set, not defaulted: a developer's own AIRFLOW_HOME must never see the tests
os.environ["AIRFLOW_HOME"] = _home
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"


def pytest_collection_modifyitems(config, items):
    """The full pipeline-parallel grid runs only when asked (``-m pipeline_grid``)."""
    import pytest

    if "pipeline_grid" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full pipeline grid: pytest -m pipeline_grid")
    for item in items:
        if "pipeline_grid" in item.keywords:
            item.add_marker(skip)
