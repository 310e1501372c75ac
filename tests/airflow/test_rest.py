"""``dagtrain run`` as a person sees it, and ``dagtrain up``/``trigger`` against a real
Airflow (api-server, scheduler, dag-processor, triggerer; SQLite, LocalExecutor) on the
same temporary home.

The module's fixture first runs ``dagtrain run`` in a pseudo-terminal of 80 columns
(what a person sees), then starts ``dagtrain up`` and reads that run's task logs the
way the web UI does, through the REST API."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import psutil
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
        family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        yield {
            "url": url,
            "home": home,
            "port": port,
            "headers": h,
            "art": tmp / "art",
            "screen": screen,
            "family": family,
        }
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # dagtrain up stops everything it started
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # after the module's tests: nothing `dagtrain up` started outlived it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in family if _alive(p)]:
        time.sleep(0.2)
    assert not [p for p in family if _alive(p)], "processes outlived dagtrain up"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_in_terminal(argv: list[str], columns: int, timeout: float = 600) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal of ``columns`` x 30 as its stdin, stdout and
    stderr; return its exit code and everything it wrote (ANSI codes included)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "30", "TERM": "xterm-256color"}
    p = subprocess.Popen(
        argv, cwd=REPO, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        else:
            p.kill()
            raise AssertionError("dagtrain run did not end: " + b"".join(chunks).decode()[-3000:])
    finally:
        os.close(master)
    return p.wait(30), b"".join(chunks).decode("utf-8", errors="replace")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_run_in_a_terminal_shows_the_stage_table_with_train_running_before_the_end(airflow):
    screen = airflow["screen"]
    plain = ANSI.sub("", screen)
    end = re.search(r"^run manual__\S+: success", plain, re.M).start()  # the summary
    running = re.search(r"│ train\s+│ running\s+│", plain)
    assert running is not None and running.start() < end, plain[-3000:]
    assert re.search(r"train epoch 1/1: loss [\d.]+, val accuracy [\d.]+", plain[:end]), plain
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
        c.laddr.ip
        for pid in airflow["family"]
        if _alive(pid)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == airflow["port"]
    }
    assert listening == {"127.0.0.1"}, listening


def _password(home: Path) -> str:
    import json

    return json.loads((home / "airflow" / "passwords.json").read_text())["admin"]


def trigger_here(airflow, *args: str) -> subprocess.CompletedProcess:
    """``dagtrain trigger`` without --url: it finds the Airflow `dagtrain up` runs on --home."""
    argv = [*DAGTRAIN, "trigger", "dagtrain_tiny", "--home", str(airflow["home"]), *args]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DAGTRAIN_AIRFLOW_URL", None)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def trigger(airflow, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
    argv = [*DAGTRAIN, "trigger", "dagtrain_tiny", "--url", airflow["url"]]
    argv += ["--home", str(airflow["home"]), *args]
    if password is not None:
        argv += ["--password", password]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, check=False)


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


def _post_run(airflow, conf: dict) -> httpx.Response:
    return httpx.post(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns",
        json={"logical_date": None, "conf": conf},
        headers=airflow["headers"],
        timeout=30,
    )


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
    r = _post_run(airflow, conf)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert param in r.text, r.text


def test_an_unknown_section_fails_the_first_task_at_once_and_wait_says_why(airflow):
    # Airflow's Params cannot refuse a top-level key they do not declare: the run is
    # created, and its first task fails at once, without retries, naming the key
    r = trigger(airflow, "--set", "trainingg.epochs=1", "--wait", "--timeout", "300")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(
        r"failed: prepare_data try 1: \w+: conf: unknown section 'trainingg'", r.stderr
    ), r.stdout + r.stderr


# -- the training page (dagtrain.plugins.app), mounted by this api-server -------------


def _tiny_run_id(airflow) -> str:
    return re.search(r"run (manual__\S+): success", ANSI.sub("", airflow["screen"])).group(1)


def test_the_plugin_is_registered_once_without_import_errors(airflow):
    h = airflow["headers"]
    plugins = httpx.get(f"{airflow['url']}/api/v2/plugins", headers=h).json()["plugins"]
    mine = [p for p in plugins if p["name"] == "dagtrain"]
    assert len(mine) == 1, plugins
    assert {v["destination"] for v in mine[0]["external_views"]} == {
        "nav",
        "dag_run",
        "task_instance",
    }
    errors = httpx.get(f"{airflow['url']}/api/v2/plugins/importErrors", headers=h).json()
    assert errors["total_entries"] == 0, errors


def test_every_training_page_endpoint_needs_an_airflow_user(airflow):
    run_id = _tiny_run_id(airflow)
    for path in (
        "/dagtrain/",
        "/dagtrain/static/app.js",
        "/dagtrain/api/pipelines",
        "/dagtrain/api/dags/dagtrain_tiny/runs",
        f"/dagtrain/api/dags/dagtrain_tiny/runs/{run_id}",
        f"/dagtrain/api/dags/dagtrain_tiny/runs/{run_id}/trace",
        "/dagtrain/api/dags/dagtrain_tiny/registry",
    ):
        r = httpx.get(f"{airflow['url']}{path}", timeout=30)
        assert r.status_code in (401, 403), (path, r.status_code)
        r = httpx.get(f"{airflow['url']}{path}", headers=airflow["headers"], timeout=30)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


def test_a_runs_report_holds_its_epochs_ranks_sync_and_config(airflow):
    run_id = _tiny_run_id(airflow)
    base = f"{airflow['url']}/dagtrain/api/dags/dagtrain_tiny/runs/{run_id}"
    r = httpx.get(base, headers=airflow["headers"], timeout=30).json()
    assert [s["state"] for s in r["stages"]] == ["success"] * 4, r["stages"]
    assert [e["epoch"] for e in r["epochs"]] == [0] and "val_accuracy" in r["epochs"][0]
    assert r["config"]["training"]["epochs"] == 1 and r["data"]["version"]
    assert [k["rank"] for k in r["ranks"]] == [0, 1] and r["sync"]["buckets"] >= 1
    assert r["tries"] == [{"try": 1, "resumed_from_step": None, "time": r["tries"][0]["time"]}]
    trace = httpx.get(f"{base}/trace", headers=airflow["headers"], timeout=30).json()
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}  # a process per rank
    reg = httpx.get(
        f"{airflow['url']}/dagtrain/api/dags/dagtrain_tiny/registry", headers=airflow["headers"]
    ).json()
    # the run made v1 (later tests' runs may add versions)
    assert reg["versions"][0]["version"] == 1 and reg["versions"][0]["lineage"]["run_id"] == run_id
    assert reg["champion"] in {v["version"] for v in reg["versions"]}


def test_the_training_page_refuses_what_is_not_a_dagtrain_run(airflow):
    h = airflow["headers"]
    for path in (
        "/dagtrain/api/dags/dagtrain_tiny/runs/..%2F..%2F..%2Fetc",
        "/dagtrain/api/dags/dagtrain_tiny/runs/no-such-run",
        "/dagtrain/api/dags/no_such_dag/runs",
        "/dagtrain/static/..%2Fapp.py",
        "/dagtrain/static/index.html.bak",
    ):
        r = httpx.get(f"{airflow['url']}{path}", headers=h, timeout=30)
        assert r.status_code in (400, 403, 404), (path, r.status_code)
        assert "import " not in r.text and "root:" not in r.text, path


def test_the_training_page_in_a_real_browser(airflow):
    """Headless Chromium (Debian's) driven by playwright: the page inside Airflow's UI
    and on its own; screenshots go to docs/images/."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on this machine (make test installs it where apt can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    from urllib.parse import quote

    run_id = _tiny_run_id(airflow)
    token = airflow["headers"]["Authorization"].split()[1]
    images = REPO / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    trace = httpx.get(
        f"{airflow['url']}/dagtrain/api/dags/dagtrain_tiny/runs/{run_id}/trace",
        headers=airflow["headers"],
    ).json()
    lanes = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.context.add_cookies([{"name": "_token", "value": token, "url": airflow["url"]}])
            page.goto(f"{airflow['url']}/dagtrain/?dag_id=dagtrain_tiny&run_id={quote(run_id)}")
            page.wait_for_selector("svg.timeline", timeout=30_000)
            # one point per epoch on every curve (the tiny pipeline trains one epoch)
            points = page.evaluate("window.dagtrainCharts.map((u) => u.data[0].length)")
            assert points == [1, 1], points
            assert int(page.get_attribute("svg.timeline", "data-lanes")) == len(lanes)
            assert {pid for pid, _ in lanes} == {0, 1}  # a lane per worker per rank
            assert page.locator("text=champion").count() >= 1
            page.screenshot(path=str(images / "training-run.png"), full_page=True)
            page.goto(f"{airflow['url']}/dagtrain/")
            page.wait_for_selector("text=Training pipelines")
            page.screenshot(path=str(images / "training-pipelines.png"))
            # inside Airflow's UI: the nav entry's page
            page.goto(f"{airflow['url']}/plugin/dagtrain")
            page.wait_for_timeout(4000)
            page.screenshot(path=str(images / "training-in-airflow.png"))
        finally:
            browser.close()
