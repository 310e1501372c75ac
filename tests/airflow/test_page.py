"""The training page (``dagtrain.plugins``) in the session's real Airflow: its endpoints,
who may read them, a failed run's ranks, the trigger form's Params, and the page itself
in headless Chromium (screenshots go to docs/images/)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, unquote

import httpx
import pytest

from .live import PYLIB, REPO, free_port, tiny_run_id

pytestmark = pytest.mark.slow
PAGE = "/dagtrain/api/dags"


def get(airflow, path: str, **kw) -> httpx.Response:
    return httpx.get(f"{airflow['url']}{path}", headers=airflow["headers"], timeout=30, **kw)


def test_the_plugin_is_registered_once_without_import_errors(airflow):
    plugins = get(airflow, "/api/v2/plugins").json()["plugins"]
    mine = [p for p in plugins if p["name"] == "dagtrain"]
    assert len(mine) == 1, plugins
    assert {v["destination"] for v in mine[0]["external_views"]} == {
        "nav",
        "dag_run",
        "task_instance",
    }
    errors = get(airflow, "/api/v2/plugins/importErrors").json()
    assert errors["total_entries"] == 0, errors


def test_every_training_page_endpoint_needs_an_airflow_user(airflow):
    run_id = tiny_run_id(airflow)
    for path in (
        "/dagtrain/",
        "/dagtrain/static/app.js",
        "/dagtrain/api/pipelines",
        f"{PAGE}/dagtrain_tiny/runs",
        f"{PAGE}/dagtrain_tiny/runs/{run_id}",
        f"{PAGE}/dagtrain_tiny/runs/{run_id}/trace",
        f"{PAGE}/dagtrain_tiny/curves",
        f"{PAGE}/dagtrain_tiny/registry",
    ):
        r = httpx.get(f"{airflow['url']}{path}", timeout=30)
        assert r.status_code in (401, 403), (path, r.status_code)
        r = get(airflow, path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    # a browser without a session is sent to Airflow's login, and back to the page after
    page = f"/dagtrain/?dag_id=dagtrain_tiny&run_id={quote(run_id, safe='')}"
    r = httpx.get(f"{airflow['url']}{page}", headers={"Accept": "text/html,*/*;q=0.8"}, timeout=30)
    assert r.status_code == 303, (r.status_code, r.text[:300])
    login = httpx.URL(r.headers["location"])
    assert login.path.startswith("/auth/") and unquote(login.params["next"]) == unquote(page)


def test_a_runs_report_holds_its_epochs_ranks_sync_and_config(airflow):
    run_id = tiny_run_id(airflow)
    r = get(airflow, f"{PAGE}/dagtrain_tiny/runs/{run_id}").json()
    assert [s["state"] for s in r["stages"]] == ["success"] * 4, r["stages"]
    assert [e["epoch"] for e in r["epochs"]] == [0] and "val_accuracy" in r["epochs"][0]
    assert r["config"]["training"]["epochs"] == 1 and r["data"]["version"]
    assert [k["rank"] for k in r["ranks"]] == [0, 1] and r["sync"]["buckets"] >= 1
    for k in r["ranks"]:  # each rank's own figures, from its status file
        assert k["status"] == "done" and k["host"], k
        assert k["samples_per_second"] > 0 and 0 < k["median_step_ms"] <= k["p95_step_ms"], k
    assert [(t["try"], t["resumed_from_step"]) for t in r["tries"]] == [(1, None)]
    # the data version's Asset event, to link to Airflow's asset page
    assert any(a["name"] == "dagtrain.tiny.data" for a in r["asset_events"]), r["asset_events"]
    trace = get(airflow, f"{PAGE}/dagtrain_tiny/runs/{run_id}/trace").json()
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}  # a process per rank
    critical = [e for e in trace["traceEvents"] if e.get("args", {}).get("critical")]
    assert {e["pid"] for e in critical} == {0, 1}, "each rank's critical path is marked"
    # the train and evaluate tasks' extra links lead to the run's page and its timeline
    for task in ("train", "evaluate"):
        links = get(
            airflow, f"/api/v2/dags/dagtrain_tiny/dagRuns/{run_id}/taskInstances/{task}/links"
        ).json()["extra_links"]
        assert set(links) >= {"Training report", "Trace"}, links
        # the page's path alone: it leads to the page on whichever server shows the UI
        assert links["Training report"].startswith("/dagtrain/?dag_id=dagtrain_tiny&run_id="), links
        assert links["Trace"].endswith("#timeline"), links
    reg = get(airflow, f"{PAGE}/dagtrain_tiny/registry").json()
    # the run made v1 (later tests' runs may add versions)
    assert reg["versions"][0]["version"] == 1 and reg["versions"][0]["lineage"]["run_id"] == run_id
    assert reg["champion"] in {v["version"] for v in reg["versions"]}


def test_several_steps_are_traced_and_runs_overlay(airflow, two_epochs):
    base = f"{PAGE}/dagtrain_tiny/runs/{quote(two_epochs, safe='')}"
    r = get(airflow, base).json()
    steps = [s["step"] for s in r["trace_steps"]]
    assert len(steps) == 2 and steps[-1] is None, r["trace_steps"]  # epoch 1's last, the last
    one = get(airflow, f"{base}/trace", params={"step": steps[0]}).json()
    assert {e["pid"] for e in one["traceEvents"]} == {0, 1}
    assert get(airflow, f"{base}/trace", params={"step": 999999}).status_code == 404
    assert get(airflow, f"{base}/trace", params={"step": "x"}).status_code in (400, 422)
    curves = get(airflow, f"{PAGE}/dagtrain_tiny/curves").json()
    by_run = {c["run_id"]: len(c["epochs"]) for c in curves}
    assert by_run[two_epochs] == 2 and by_run[tiny_run_id(airflow)] == 1, by_run
    assert get(airflow, f"{PAGE}/dagtrain_tiny/curves", params={"limit": 500}).status_code == 422


def test_a_run_whose_rank_was_killed_names_the_rank_and_why(airflow, failed_run):
    r = get(airflow, f"{PAGE}/dagtrain_tiny_fail/runs/{quote(failed_run, safe='')}").json()
    train = next(s for s in r["stages"] if s["task_id"] == "train")
    assert train["state"] == "failed", r["stages"]
    ranks = {k["rank"]: k for k in r["ranks"]}
    assert ranks[1]["status"] == "failed" and ranks[1]["signal"] == "SIGKILL", ranks
    assert "SIGKILL" in ranks[1]["how"], ranks[1]
    assert any("kills itself" in line for line in ranks[1]["last_lines"]), ranks[1]
    assert ranks[0]["status"] == "stopped", ranks[0]
    assert r["failures"][0]["try"] == 1 and r["failures"][0]["rank"] == 1


def test_the_trigger_form_describes_every_field_and_offers_only_what_a_run_may_change(airflow):
    params = get(airflow, "/api/v2/dags/dagtrain_tiny/details").json()["params"]
    for name in ("model", "training", "distributed", "executor", "data"):
        p = params[name]
        assert p["description"], name  # the section's own words
        fields = p["schema"]["properties"]
        assert all(f.get("description") for f in fields.values()), (name, fields)
    retries = params["training"]["schema"]["properties"]["retries"]
    assert "config file only" in retries["description"], retries
    # Airflow's trigger form renders a Param whose schema is a `const` as a hidden field
    for name in ("name", "pipeline", "schedule", "artifacts", "rounds", "evaluation"):
        assert "const" in params[name]["schema"], (name, params[name])
    assert "decides which model becomes the champion" in params["evaluation"]["description"]
    test_fraction = params["data"]["schema"]["properties"]["test_fraction"]
    assert "const" in test_fraction and "config file only" in test_fraction["description"]
    assert "not used by a retraining pipeline" in params["rounds"]["description"]
    r = httpx.post(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns",
        json={"logical_date": None, "conf": {"rounds": {"local_steps": 3}}},
        headers=airflow["headers"],
        timeout=30,
    )
    assert r.status_code == 400 and "rounds" in r.text, r.text


def test_the_training_page_refuses_what_is_not_a_dagtrain_run(airflow):
    for path in (
        f"{PAGE}/dagtrain_tiny/runs/..%2F..%2F..%2Fetc",
        f"{PAGE}/dagtrain_tiny/runs/no-such-run",
        f"{PAGE}/no_such_dag/runs",
        "/dagtrain/static/..%2Fapp.py",
        "/dagtrain/static/index.html.bak",
    ):
        r = get(airflow, path)
        assert r.status_code in (400, 403, 404), (path, r.status_code)
        assert "import " not in r.text and "root:" not in r.text, path
        assert str(airflow["art"]) not in r.text and "/tmp" not in r.text, r.text  # no path


@pytest.fixture(scope="module")
def restricted(airflow):
    """A second api-server on the same database, whose auth manager lets the viewer
    ``outsider`` read every DAG but dagtrain_tiny (pylib/restricted_auth.py)."""
    from dagtrain.cli.embedded import Home

    port = free_port()
    env = {
        **os.environ,
        **Home(root=airflow["home"], dags=airflow["dags"], port=port).environment(),
        "PYTHONPATH": str(PYLIB),
        "AIRFLOW__CORE__AUTH_MANAGER": "restricted_auth.RestrictedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,outsider:viewer",
    }
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "airflow", "api-server", "--port", str(port), "-w", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the restricted api-server exited"
            assert time.monotonic() < deadline, "the restricted api-server did not come up"
            try:
                pw = json.loads((airflow["home"] / "airflow" / "passwords.json").read_text())
                tok = httpx.post(
                    f"{url}/auth/token",
                    json={"username": "outsider", "password": pw["outsider"]},
                    timeout=5,
                )
                if tok.status_code < 300:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(1)
        yield url, {"Authorization": f"Bearer {tok.json()['access_token']}"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_an_xcom_rewritten_through_the_rest_api_cannot_point_the_page_elsewhere(
    airflow, failed_run
):
    """A user who may trigger runs may write XComs (Airflow's REST API): prepare_data's
    ``dir`` rewritten to another pipeline's data folder changes nothing the page reads.
    Its files come from the run's DAG version (the data Asset's folder, from the DAG
    file's config), so dagtrain_tiny's page shows dagtrain_tiny's run and registry."""
    run_id = tiny_run_id(airflow)
    entry = (
        f"/api/v2/dags/dagtrain_tiny/dagRuns/{quote(run_id, safe='')}"
        "/taskInstances/prepare_data/xcomEntries/return_value"
    )
    mine = get(airflow, entry, params={"deserialize": True}).json()["value"]
    other = get(
        airflow,
        f"/api/v2/dags/dagtrain_tiny_fail/dagRuns/{quote(failed_run, safe='')}"
        "/taskInstances/prepare_data/xcomEntries/return_value",
        params={"deserialize": True},
    ).json()["value"]
    assert mine["dir"] != other["dir"]
    before = get(airflow, f"{PAGE}/dagtrain_tiny/runs/{quote(run_id, safe='')}").json()
    forged = {**mine, "dir": other["dir"], "manifest": other["manifest"]}

    def patch(value) -> None:
        r = httpx.patch(
            f"{airflow['url']}{entry}",
            headers=airflow["headers"],
            json={"value": value, "map_index": -1},
            timeout=30,
        )
        assert r.status_code == 200, r.text[:300]

    patch(forged)
    try:
        r = get(airflow, f"{PAGE}/dagtrain_tiny/runs/{quote(run_id, safe='')}").json()
        assert r["data"]["dir"] == other["dir"]  # shown as the XCom says, as text
        assert r["config"] == before["config"] and r["config"]
        tiny_root = Path(mine["dir"]).parents[1]  # <root>/data/<version>
        assert Path(r["config"]["checkpoint_dir"]).is_relative_to(tiny_root)
        assert r["epochs"] == before["epochs"] and r["epochs"]
        reg = get(airflow, f"{PAGE}/dagtrain_tiny/registry").json()
        dags = {v["lineage"]["dag_id"] for v in reg["versions"]}
        assert dags == {"dagtrain_tiny"}, dags
    finally:
        patch(mine)


def test_a_user_who_may_not_read_a_dag_gets_403_for_its_runs(airflow, restricted):
    url, h = restricted
    run_id = quote(tiny_run_id(airflow), safe="")
    for path in (
        f"{PAGE}/dagtrain_tiny/runs",
        f"{PAGE}/dagtrain_tiny/runs/{run_id}",
        f"{PAGE}/dagtrain_tiny/runs/{run_id}/trace",
        f"{PAGE}/dagtrain_tiny/curves",
        f"{PAGE}/dagtrain_tiny/registry",
    ):
        r = httpx.get(f"{url}{path}", headers=h, timeout=30)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
    listed = httpx.get(f"{url}/dagtrain/api/pipelines", headers=h, timeout=30).json()
    from .conftest import DAG_IDS

    # all the others, not the hidden one; a DAG whose runs they may not read, without them
    assert sorted(p["dag_id"] for p in listed) == sorted(set(DAG_IDS) - {"dagtrain_tiny"}), listed
    assert next(p for p in listed if p["dag_id"] == "dagtrain_tiny_fail")["runs"] == []
    r = httpx.get(f"{url}{PAGE}/dagtrain_tiny_fail/runs", headers=h, timeout=30)
    assert r.status_code == 403, r.text[:300]
    r = httpx.get(f"{url}{PAGE}/dagtrain_tiny_mine/runs", headers=h, timeout=30)
    assert r.status_code == 200, r.text[:300]


def test_the_training_page_in_a_real_browser(airflow, two_epochs, failed_run):
    """Headless Chromium (Debian's) driven by playwright: the page inside Airflow's UI
    and on its own; screenshots go to docs/images/."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on this machine (make test installs it where apt can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")

    token = airflow["headers"]["Authorization"].split()[1]
    images = REPO / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    trace = get(airflow, f"{PAGE}/dagtrain_tiny/runs/{quote(two_epochs, safe='')}/trace").json()
    # each rank names the threads its step ran on (the caller and the workers it used)
    lanes = {
        (e["pid"], e["tid"])
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    page_of = f"{airflow['url']}/dagtrain/?dag_id=%s&run_id=%s"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.context.add_cookies([{"name": "_token", "value": token, "url": airflow["url"]}])
            page.goto(page_of % ("dagtrain_tiny", quote(two_epochs, safe="")))
            page.wait_for_selector("svg.timeline", timeout=30_000)
            # this run's train and validation curves: one point per epoch (2 epochs)
            # (the metrics' charts: their first line is "train"; the LR's beside the loss)
            metric_charts = 'window.dagtrainCharts.filter((u) => u.series[1]?.label === "train")'
            points = page.evaluate(
                f"{metric_charts}.map((u) => [1, 2].map((i) =>"
                " u.data[i].filter((v) => v != null).length))"
            )
            assert points == [[2, 2], [2, 2]], points
            overlaid = page.evaluate(f"{metric_charts}.map((u) => u.series.length - 1)")
            assert min(overlaid) >= 3, overlaid  # train, validation, and another run's
            lr = page.evaluate(
                'window.dagtrainCharts.filter((u) => u.series[1]?.label.startsWith("LR"))'
                ".map((u) => u.data[1].filter((v) => v != null).length)"
            )
            assert lr == [2], lr  # the LR of each epoch
            assert int(page.get_attribute("svg.timeline", "data-lanes")) == len(lanes)
            assert {pid for pid, _ in lanes} == {0, 1}  # a lane per worker per rank
            assert page.locator("svg.timeline rect.critical").count() >= 2
            assert page.locator("#step option").count() == 2
            assert page.locator("text=champion").count() >= 1
            page.screenshot(path=str(images / "training-run.png"), full_page=True)
            page.locator("svg.timeline").screenshot(path=str(images / "training-timeline.png"))
            page.locator("table.ranks").screenshot(path=str(images / "training-ranks.png"))
            page.locator("table.registry").screenshot(path=str(images / "training-registry.png"))
            # another traced step: the timeline follows the choice
            page.select_option("#step", index=0)
            page.wait_for_function("new URLSearchParams(location.search).has('step')")
            page.wait_for_selector("svg.timeline")
            # a failed run: the rank that was killed, and why, at the top and in the table
            page.goto(page_of % ("dagtrain_tiny_fail", quote(failed_run, safe="")))
            page.wait_for_selector("table.ranks", timeout=30_000)
            top = page.locator("p.failure").inner_text()
            assert "rank 1" in top and "SIGKILL" in top, top
            assert "kills itself" in page.locator("table.ranks").inner_text()
            page.screenshot(path=str(images / "training-failed-run.png"), full_page=True)
            # Airflow's trigger form: the sections a run may change, with their
            # descriptions; the others are hidden inputs
            page.goto(f"{airflow['url']}/dags/dagtrain_tiny")
            page.get_by_role("button", name="Trigger").first.click()
            page.wait_for_selector("text=Run Parameters", timeout=30_000)
            page.wait_for_timeout(1500)
            labels = {t.split("\n")[0] for t in page.locator("label").all_inner_texts()}
            assert {"model", "training", "distributed", "data"} <= labels, labels
            assert not {"rounds", "schedule", "artifacts", "name", "evaluation"} & labels, labels
            hidden = page.locator("input[type=hidden]").evaluate_all("l => l.map(e => e.name)")
            assert {
                *("element_rounds", "element_schedule", "element_artifacts"),
                "element_evaluation",
            } <= set(hidden)
            assert page.get_by_text("The optimisation every rank runs").count() == 1
            page.screenshot(path=str(images / "trigger-form.png"))
            page.goto(f"{airflow['url']}/dagtrain/")
            page.wait_for_selector("text=Training pipelines")
            page.screenshot(path=str(images / "training-pipelines.png"))
            # inside Airflow's UI: the nav entry's page
            page.goto(f"{airflow['url']}/plugin/dagtrain")
            page.wait_for_timeout(4000)
            page.screenshot(path=str(images / "training-in-airflow.png"))
        finally:
            browser.close()
