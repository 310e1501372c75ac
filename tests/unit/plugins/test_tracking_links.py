"""The training page's MLflow links, from the records the stages wrote: the run's
MLflow run, each registry version's MLflow model version (report, then the page's own
script in headless Chromium); none where the pipeline has no tracking."""

from __future__ import annotations

import json

import pytest

from dagtrain.plugins import report
from dagtrain.records.layout import ArtifactLayout

from . import browser
from .pipeline_fixture import DAG
from .test_page_report import make_run

URI = "http://mlflow.example:5000"


def with_records(tmp_path):
    root, data = make_run(tmp_path)
    lay = ArtifactLayout(root, DAG)
    run = lay.run("manual__1").dir
    rec = {"uri": URI, "experiment_id": "4", "run_id": "r123", "experiment": "p"}
    (run / "mlflow.json").write_text(json.dumps(rec))
    lay.registry.mkdir(parents=True)
    version = {"version": 1, "metrics": {"test_accuracy": 0.9, "test_loss": 0.3}}
    entry = version | {
        "promoted": True,
        "reason": "the first model",
        "lineage": {"dag_id": DAG, "run_id": "manual__1"},
    }
    lay.registry_file.write_text(json.dumps({"champion": 1, "versions": [entry]}))
    versions = {"1": {"name": "p", "version": "7"}}
    (lay.registry / "mlflow.json").write_text(json.dumps({"uri": URI, "versions": versions}))
    return root, data


def test_the_report_links_the_run_and_each_version(tmp_path):
    root, _ = with_records(tmp_path)
    r = report.run_report(root, DAG, "manual__1", [], None, None)
    assert r["mlflow"] == {
        "url": f"{URI}/#/experiments/4/runs/r123",
        "run_id": "r123",
        "experiment": "p",
        "pending": False,
    }
    assert report.registry_of(root)["mlflow"] == {
        "1": {"url": f"{URI}/#/models/p/versions/7", "name": "p", "version": "7"}
    }


def test_without_tracking_there_is_no_link(tmp_path):
    root, _ = make_run(tmp_path)
    assert report.run_report(root, DAG, "manual__1", [], None, None)["mlflow"] is None
    assert report.registry_of(root)["mlflow"] == {}


@pytest.mark.slow
def test_the_page_shows_the_links(tmp_path):
    if browser.chromium() is None:
        pytest.skip("no chromium on this machine (make browser installs it where apt can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    root, data = with_records(tmp_path)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser.chromium(), args=["--no-sandbox"])
        try:
            page = b.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            browser.serve(page, root, data, "manual__1")
            page.goto(browser.page_url("manual__1"))
            page.wait_for_selector("#registry", timeout=15_000)
            run_link = page.locator("p.mlflow a")
            assert run_link.get_attribute("href") == f"{URI}/#/experiments/4/runs/r123"
            assert run_link.inner_text() == "run r123"
            version = page.locator("table.registry a.mlflow")
            assert version.get_attribute("href") == f"{URI}/#/models/p/versions/7"
            assert version.inner_text() == "MLflow p v7"
            assert not errors, errors
        finally:
            b.close()
