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
