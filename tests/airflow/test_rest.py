"""``dagtrain run`` as a person sees it, and ``dagtrain up``/``trigger`` against a real
Airflow (the session's, ``conftest.py``): the 80-column screen of ``dagtrain run``, the
task logs the web UI reads through the REST API, triggers and refused confs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from .live import (
    ANSI,
    DAGTRAIN,
    REPO,
    alive,
    free_port,
    post_run,
    trigger,
    trigger_here,
)

pytestmark = pytest.mark.slow


def test_run_in_a_terminal_shows_the_stage_table_with_train_running_before_the_end(airflow):
    screen = airflow["screen"]
    plain = ANSI.sub("", screen)
    end = re.search(r"^run manual__\S+: success", plain, re.M).start()  # the summary
    running = re.search(r"│ train\s+│ running\s+│", plain)
    assert running is not None and running.start() < end, plain[-3000:]
    # (80 columns: the metric's name shortened to leave room for the LR and samples/s)
    line = r"train epoch 1/1: loss [\d.]+, val acc [\d.]+, lr [\d.]+e-\d"
    assert re.search(line, plain[:end]), plain
    # nothing of Airflow's own output on the screen; paths whole, never hard-wrapped
    assert "[info" not in plain and "DagRun Finished" not in plain, plain[-3000:]
    log = re.search(r"its output: (\S+)\)", plain)
    assert log is not None and Path(log.group(1)).exists(), plain[:500]


def _logs(airflow, run_id: str, task_id: str, attempt: int = 1) -> str:
    r = httpx.get(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns/{run_id}/taskInstances/"
        f"{task_id}/logs/{attempt}",
        headers={**airflow["headers"], "Accept": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    return "\n".join(str(c.get("event", c)) if isinstance(c, dict) else str(c) for c in content)


def test_the_task_logs_of_a_dagtrain_run_are_airflows_own_with_the_ranks_lines(airflow):
    run_id = re.search(r"run (manual__\S+): success", ANSI.sub("", airflow["screen"])).group(1)
    for task_id in ("prepare_data", "train", "evaluate", "promote"):
        text = _logs(airflow, run_id, task_id)
        assert "Log file not found" not in text and text.strip(), (task_id, text[:500])
        # nothing of the CLI's display: no table frame, no progress line
        assert not set("┏┃│└") & set(text), (task_id, text[:2000])
        assert "epoch 1/1:" not in text and f"{task_id} started" not in text, task_id
    train = _logs(airflow, run_id, "train")
    assert "[rank 0]" in train and "[rank 1]" in train, train[:3000]


def test_up_listens_on_loopback_and_remembers_its_url(airflow):
    up = json.loads((airflow["home"] / "airflow" / "up.json").read_text())
    assert up["url"] == f"http://localhost:{airflow['port']}"
    listening = {
        (c.laddr.ip, c.laddr.port)
        for pid in airflow["family"]
        if alive(pid)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    # the UI and the one log server (Airflow's own would listen on every interface), and
    # nothing else of what `up` started listens anywhere but the loopback
    assert {("127.0.0.1", airflow["port"]), ("127.0.0.1", airflow["port"] + 1)} <= listening
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening


def test_trigger_starts_a_run_that_succeeds_and_its_conf_reaches_the_ranks(airflow):
    r = trigger_here(
        airflow,
        "--set",
        "training.epochs=2",
        "--set",
        "training.lr=0.125",
        "--wait",
        "--timeout",
        "300",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "success" in r.stdout
    # the same closing lines as `dagtrain run`, read from the stages' XComs
    assert re.search(r"^validation accuracy [\d.]+ \(after 2 epoch", r.stdout, re.M), r.stdout
    assert re.search(r"^test accuracy [\d.]+ \(test loss", r.stdout, re.M), r.stdout
    assert re.search(r"^(promoted v\d|not promoted: )", r.stdout, re.M), r.stdout
    from dagtrain.records.layout import safe_name

    run_id = re.search(r"triggered dagtrain_tiny run (\S+)", r.stdout).group(1)
    run = airflow["art"] / "tiny" / "runs" / "dagtrain_tiny" / safe_name(run_id)
    train = run / "train"
    received = json.loads((train / "config.json").read_text())
    assert received["training"]["lr"] == 0.125 and received["training"]["epochs"] == 2
    assert json.loads((train / "result.json").read_text())["config"] == received
    # the logs command it ends with runs as printed (it once left out the home whose
    # password it needs)
    printed = re.search(r"^task logs: dagtrain logs (.+)$", r.stdout, re.M).group(1).split()
    logs = subprocess.run(
        [*DAGTRAIN, "logs", *[a if a != "TASK" else "train" for a in printed]],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
        check=False,
    )
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "DistributedTrainOperator" in logs.stdout, logs.stdout[-2000:]


def test_a_conf_that_violates_the_schema_is_refused_naming_the_field(airflow):
    r = trigger(airflow, "--set", "training.epochs=0")
    assert r.returncode != 0
    assert "refused the run's conf" in r.stderr and "training" in r.stderr
    assert "epochs" in r.stderr, r.stderr
    r = trigger(airflow, "--set", "model.name=os:system")
    assert r.returncode != 0 and "model" in r.stderr, r.stderr


def test_a_wrong_password_is_refused(airflow):
    r = trigger(airflow, password="not-the-password")
    assert r.returncode != 0
    assert "refused the credentials" in r.stderr, r.stderr


def test_an_unreachable_server_is_named(airflow):
    r = subprocess.run(
        [*DAGTRAIN, "trigger", "x", "--url", f"http://127.0.0.1:{free_port()}", "--password", "p"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0 and "cannot reach Airflow" in r.stderr, r.stderr


def test_a_run_made_by_dagtrain_run_is_visible_in_the_api(airflow):
    r = httpx.get(f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns", headers=airflow["headers"])
    assert r.status_code == 200, r.text
    runs = r.json()["dag_runs"]
    # dag.test() marks its runs triggered_by "test"; the trigger test's run is "rest_api"
    mine = [x for x in runs if x["state"] == "success" and x.get("triggered_by") == "test"]
    assert mine, runs
    # and its task logs are where the UI reads them, ranks' lines included
    run_id = mine[0]["dag_run_id"]
    log = httpx.get(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns/{run_id}/taskInstances/train/logs/1",
        headers={**airflow["headers"], "Accept": "application/json"},
    )
    assert log.status_code == 200, log.text
    assert "[rank 1]" in log.text and "[rank 0]" in log.text, log.text[:2000]


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"name": "evil"}, "name"),
        ({"pipeline": "rounds"}, "pipeline"),
        ({"training": {"retries": 5}}, "training"),
        ({"training": {"timeout_minutes": 1}}, "training"),
        ({"data": {"source": "/etc/elsewhere.csv"}}, "data"),
        ({"schedule": {"cron": "@hourly"}}, "schedule"),
    ],
)
def test_the_rest_api_refuses_a_conf_that_changes_what_only_the_file_may_set(airflow, conf, param):
    r = post_run(airflow, conf)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert param in r.text, r.text


def test_an_unknown_section_fails_the_first_task_at_once_naming_it(airflow):
    # Airflow's Params cannot refuse a top-level key they do not declare: a conf posted
    # to the REST API makes a run, whose first task fails at once, without retries,
    # naming the key as `validate`, `run --set` and `trigger --set` do (trigger checks it
    # before it creates a run: test_trigger.py)
    import time

    r = post_run(airflow, {"trainingg": {"epochs": 1}})
    assert r.status_code < 300, r.text
    run_id = r.json()["dag_run_id"]
    base = f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns/{run_id}"
    deadline = time.monotonic() + 300
    while httpx.get(base, headers=airflow["headers"]).json()["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(2)
    tis = httpx.get(f"{base}/taskInstances", headers=airflow["headers"]).json()
    first = next(t for t in tis["task_instances"] if t["task_id"] == "prepare_data")
    assert (first["state"], first["try_number"]) == ("failed", 1), first
    log = httpx.get(
        f"{base}/taskInstances/prepare_data/logs/1",
        params={"full_content": True},
        headers={**airflow["headers"], "Accept": "application/json"},
    ).text
    assert "conf: unknown section 'trainingg' \\u2014 did you mean 'training'?" in log or (
        "conf: unknown section 'trainingg' — did you mean 'training'?" in log
    ), log[-2000:]
