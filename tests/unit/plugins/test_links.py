"""Links to the training page: the UI's links are the page's path (the browser takes
the server from the UI it is on), a link that outlives the run (MLflow's tag) is the
home's UI address, never the port of the api-server a `dagtrain run` started."""

from __future__ import annotations

import json

import pytest

from dagtrain.plugins.links import page_url


@pytest.mark.parametrize(
    ("base", "absolute", "path"),
    [
        ("http://localhost:8080", "http://localhost:8080/dagtrain/", "/dagtrain/"),
        (
            "https://example.com/airflow/",
            "https://example.com/airflow/dagtrain/",
            "/airflow/dagtrain/",
        ),
        ("", "/dagtrain/", "/dagtrain/"),
    ],
)
def test_the_ui_link_is_the_pages_path_under_base_urls_path(monkeypatch, base, absolute, path):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base)
    query = "?dag_id=d&run_id=manual__1%2B00"
    assert page_url("d", "manual__1+00") == f"{absolute}{query}"
    assert page_url("d", "manual__1+00", "timeline", absolute=False) == f"{path}{query}#timeline"


def test_a_run_names_the_homes_ui_not_its_own_execution_api(tmp_path):
    from dagtrain.cli.embedded import Home

    h = Home(tmp_path / "home", tmp_path / "dags")
    h.make()
    assert h.served_url() is None  # no `dagtrain up` yet: the default
    assert (
        Home(tmp_path / "home", tmp_path / "dags").environment()["AIRFLOW__API__BASE_URL"]
        == "http://localhost:8080"
    )
    h.ui_file.write_text(json.dumps({"url": "http://10.0.0.5:9090", "port": 9090}))
    h.ui_url = h.served_url()  # `dagtrain up --host 10.0.0.5 --port 9090` served it
    h.execution_port = 41229  # what `dagtrain run`'s own api-server bound
    env = h.environment()
    assert env["AIRFLOW__API__BASE_URL"] == "http://10.0.0.5:9090"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:41229/execution/"
    assert env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] == "41230"  # not up's 9091
