"""The Airflow the tests of this folder talk to: ``dagtrain run`` of the tiny pipeline
in an 80-column pseudo-terminal, then ``dagtrain up`` (api-server, scheduler,
dag-processor, triggerer; SQLite, LocalExecutor) on the same home, for the tests of
this package (see the fixture). Its DAGs folder has ``dagtrain_tiny``,
``dagtrain_tiny_fail`` (rank 1 killed mid-training), three pipelines with bad input
only the ranks meet (``..._badargs``, ``..._nocuda``, ``..._rankimport``) and one whose
model module lies beside the DAG files (``dagtrain_tiny_mine``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

import httpx
import psutil
import pytest

from .live import (
    ANSI,
    DAGTRAIN,
    PYLIB,
    REPO,
    alive,
    free_port,
    password_of,
    run_in_terminal,
    trigger,
)

DAG_IDS = (
    "dagtrain_tiny",
    "dagtrain_tiny_fail",
    "dagtrain_tiny_badargs",
    "dagtrain_tiny_nocuda",
    "dagtrain_tiny_rankimport",
    "dagtrain_tiny_mine",
)


# the package's: it ends when its last test has run (with pytest-xdist: on the one worker
# that runs the group, see tests/conftest.py), not with the session, so that an idle
# Airflow (scheduler, dag-processor, triggerer, api-server) does not take CPU from the
# tests that follow it
@pytest.fixture(scope="package")
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
    # a pipeline whose rank 1 is killed mid-training (PYLIB has its model factory)
    shutil.copy(REPO / "dags" / "digits_retraining.py", dags / "tiny_fail.py")
    (dags / "tiny_fail.yaml").write_text(
        "name: tiny_fail\ndata: {source: digits}\n"
        "model: {name: 'faulty_model:mlp_dying_on_rank', args: {rank: 1, at_call: 6}}\n"
        "training: {epochs: 1, batch_size: 64, retries: 0}\n"
        "distributed: {backend: mpi, ranks: 2}\nschedule: {cron: null}\n"
        f"artifacts: {{root: {tmp / 'art'}}}\n"
    )
    # bad input each try would meet again (retries: 2, yet one try only), and a model
    # module of the DAG author's beside the DAG files (no PYTHONPATH names the folder)
    for name, model, extra in (
        ("tiny_badargs", "{name: mlp, args: {hiddn: [16]}}", ""),
        ("tiny_nocuda", "{name: mlp, args: {hidden: [16]}}", ", device: cuda"),
        ("tiny_rankimport", "{name: 'only_in_tasks:small'}", ""),
        ("tiny_mine", "{name: 'my_models:small_mlp', args: {width: 16}}", ""),
    ):
        shutil.copy(REPO / "dags" / "digits_retraining.py", dags / f"{name}.py")
        retries = 0 if name == "tiny_mine" else 2
        (dags / f"{name}.yaml").write_text(
            f"name: {name}\ndata: {{source: digits}}\nmodel: {model}\n"
            f"training: {{epochs: 2, batch_size: 64, retries: {retries}, "
            "retry_delay_seconds: 0}\n"
            f"distributed: {{backend: mpi, ranks: 2{extra}}}\nschedule: {{cron: null}}\n"
            f"artifacts: {{root: {tmp / 'art'}}}\n"
        )
    shutil.copy(PYLIB / "my_models.py", dags / "my_models.py")
    shutil.copy(PYLIB / "only_in_tasks.py", dags / "only_in_tasks.py")
    port = free_port()
    home = tmp / "home"
    # first a run made by `dagtrain run` on the same home, in a terminal: `up` must show it
    code, screen = run_in_terminal(
        [*DAGTRAIN, "run", str(dags / "tiny.yaml"), "--home", str(home)], columns=80
    )
    assert code == 0, screen
    proc = subprocess.Popen(
        [*DAGTRAIN, "up", "--port", str(port), "--home", str(home), "--dags", str(dags)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(PYLIB)},
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
                    json={"username": "admin", "password": password_of(home)},
                    timeout=5,
                )
                if tok.status_code < 300:
                    h = {"Authorization": f"Bearer {tok.json()['access_token']}"}
                    dags_seen = [
                        httpx.get(f"{url}/api/v2/dags/{d}", headers=h).status_code for d in DAG_IDS
                    ]
                    if set(dags_seen) == {200}:
                        break
            except (httpx.HTTPError, FileNotFoundError, KeyError):
                pass
            time.sleep(2)
        family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        yield {
            "url": url,
            "home": home,
            "port": port,
            "headers": h,
            "art": tmp / "art",
            "screen": screen,
            "family": family,
            "dags": dags,
        }
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # dagtrain up stops everything it started
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # after the session's tests: nothing `dagtrain up` started outlived it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in family if alive(p)]:
        time.sleep(0.2)
    assert not [p for p in family if alive(p)], "processes outlived dagtrain up"


# runs of the session's Airflow that several modules read, made once each (a DAG run
# here is two ranks, four tasks and a trigger command: tens of seconds of CPU)
@pytest.fixture(scope="package")
def two_epochs_trigger(airflow) -> subprocess.CompletedProcess:
    """``dagtrain trigger --set training.epochs=2 --wait`` of dagtrain_tiny, as the user
    ran it: test_trigger reads what it printed, test_page the run it made."""
    return trigger(airflow, "--set", "training.epochs=2", "--wait", "--timeout", "300")


@pytest.fixture(scope="package")
def two_epochs(two_epochs_trigger) -> str:
    """That run's id: two traced steps, two points a curve."""
    r = two_epochs_trigger
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"triggered dagtrain_tiny run (\S+)", ANSI.sub("", r.stdout)).group(1)


@pytest.fixture(scope="package")
def failed_run(airflow) -> str:
    """A finished run of dagtrain_tiny_fail: its rank 1 SIGKILLs itself in its 6th step."""
    r = trigger(airflow, "--wait", "--timeout", "300", dag_id="dagtrain_tiny_fail")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rank 1" in r.stderr, r.stderr
    return re.search(r"triggered dagtrain_tiny_fail run (\S+)", ANSI.sub("", r.stdout)).group(1)
