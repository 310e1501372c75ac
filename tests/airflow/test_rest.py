"""``dagtrain trigger`` against a real Airflow: api-server, scheduler, dag-processor and
triggerer started by ``dagtrain up`` on SQLite (LocalExecutor), in a temporary home."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).parents[2]
DAGTRAIN = [sys.executable, "-m", "dagtrain"]

pytestmark = pytest.mark.slow


def free_port() -> int:
    # the api-server takes port, the log servers port + 1 and + 2
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000 and all(_free(port + k) for k in (1, 2)):
            return port
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    dags = tmp / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "digits_retraining.py", dags / "tiny.py")
    (dags / "tiny.yaml").write_text(
        "name: tiny\ndata: {source: digits}\nmodel: {name: mlp, args: {hidden: [16]}}\n"
        "training: {epochs: 1, batch_size: 64, retries: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\nschedule: {cron: null}\n"
        f"artifacts: {{root: {tmp / 'art'}}}\n"
    )
    port = free_port()
    home = tmp / "home"
    # first a run made by `dagtrain run` on the same home: `up` must show it
    ran = subprocess.run(
        [*DAGTRAIN, "run", str(dags / "tiny.yaml"), "--home", str(home)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    proc = subprocess.Popen(
        [*DAGTRAIN, "up", "--port", str(port), "--home", str(home), "--dags", str(dags)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://localhost:{port}"
    deadline = time.monotonic() + 240
    try:
        while True:  # up, and the DAG parsed by the dag-processor
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "Airflow did not come up with the DAG"
            try:
                tok = httpx.post(
                    f"{url}/auth/token",
                    json={"username": "admin", "password": _password(home)},
                    timeout=5,
                )
                if tok.status_code < 300:
                    h = {"Authorization": f"Bearer {tok.json()['access_token']}"}
                    if httpx.get(f"{url}/api/v2/dags/dagtrain_tiny", headers=h).status_code == 200:
                        break
            except (httpx.HTTPError, FileNotFoundError, KeyError):
                pass
            time.sleep(2)
        yield {"url": url, "home": home, "port": port, "headers": h, "art": tmp / "art"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # dagtrain up stops its four processes
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _password(home: Path) -> str:
    import json

    return json.loads((home / "airflow" / "passwords.json").read_text())["admin"]


def trigger(airflow, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
    argv = [*DAGTRAIN, "trigger", "dagtrain_tiny", "--url", airflow["url"]]
    argv += ["--home", str(airflow["home"]), *args]
    if password is not None:
        argv += ["--password", password]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def test_trigger_starts_a_run_that_succeeds_and_its_conf_reaches_the_ranks(airflow):
    r = trigger(
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
    import json
    import re

    from dagtrain.stages.files import safe_name

    run_id = re.search(r"triggered dagtrain_tiny run (\S+)", r.stdout).group(1)
    train = airflow["art"] / "tiny" / "runs" / safe_name(run_id) / "train"
    received = json.loads((train / "config.json").read_text())
    assert received["training"]["lr"] == 0.125 and received["training"]["epochs"] == 2
    assert json.loads((train / "result.json").read_text())["config"] == received


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
