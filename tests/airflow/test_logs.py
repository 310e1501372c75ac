"""``dagtrain logs`` on the session's real Airflow: the run ``dagtrain run`` made on its
home (read from the home's database, and through the REST API of the ``dagtrain up``
serving it), a run whose rank was killed, what bad input gets, and ``log_files``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .live import DAGTRAIN, REPO, tiny_run_id

pytestmark = pytest.mark.slow
TASKS = ["prepare_data", "train", "evaluate", "promote"]
# "train  try 2 (tries 1, 2)  success  <file>": the try shown, the tries there are
HEADER = re.compile(r"^(\S+)  try (\d+)(?: \(tries ([\d, ]+)\))?(?:  (\w+))?", re.M)


def logs(airflow, *args: str, url: bool = False) -> subprocess.CompletedProcess:
    argv = [*DAGTRAIN, "logs", *args, "--home", str(airflow["home"])]
    if url:
        argv += ["--url", airflow["url"]]  # the password: from the home, as trigger finds it
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DAGTRAIN_AIRFLOW_URL", None)
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=120, check=False
    )


def headers(text: str) -> list[tuple[str, int, int, str | None]]:
    return [
        (t, int(n), max([int(n), *(int(k) for k in tries.split(",") if k.strip())]), state)
        for t, n, tries, state in HEADER.findall(text)
    ]


def test_the_train_tasks_log_from_the_home_shows_every_ranks_lines(airflow):
    run_id = tiny_run_id(airflow)
    r = logs(airflow, run_id, "train")  # (its deadline: logs()'s timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert headers(r.stdout) == [("train", 1, 1, "success")], r.stdout
    lines = r.stdout.splitlines()
    # a line a record: its time, level, logger and event
    rank = [line for line in lines if "[rank 0]" in line]
    assert rank and any("[rank 1]" in line for line in lines), r.stdout
    assert re.match(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO +"
        r"DistributedTrainOperator: "
        r"\[rank 0\] ",
        rank[0],
    ), rank[0]
    assert any("training mlp on 2 mpi rank(s)" in line for line in lines), r.stdout
    assert not any(line.endswith("::endgroup::") or '{"' in line for line in lines), r.stdout
    assert "\x1b[" not in r.stdout + r.stderr  # piped: plain text
    # Airflow's own console lines (a plugin's warning, say) are not among the log's
    assert r.stdout.startswith("train  try 1  success"), r.stdout[:500]


def test_without_a_task_every_task_is_shown_in_the_dags_order(airflow):
    r = logs(airflow, tiny_run_id(airflow))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [h[0] for h in headers(r.stdout)] == TASKS, r.stdout
    assert {h[1:] for h in headers(r.stdout)} == {(1, 1, "success")}
    # each task's own lines under its header
    at = [r.stdout.find(s) for s in ("prepare_data  try", "prepared in", "train  try", "[rank 0]")]
    assert -1 not in at and at == sorted(at), r.stdout


def test_through_the_rest_api_the_same_lines(airflow):
    run_id = tiny_run_id(airflow)
    here, there = logs(airflow, run_id, "train"), logs(airflow, run_id, "train", url=True)
    assert there.returncode == 0, there.stdout + there.stderr
    assert there.stdout == here.stdout
    every = logs(airflow, run_id, "--dag", "dagtrain_tiny", url=True)
    assert [h[0] for h in headers(every.stdout)] == TASKS, every.stdout + every.stderr


def test_a_killed_rank_shows_as_the_tasks_error_with_its_exception(airflow, failed_run):
    for url in (False, True):
        r = logs(airflow, failed_run, url=url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert headers(r.stdout) == [("prepare_data", 1, 1, "success"), ("train", 1, 1, "failed")]
        assert "evaluate: did not run (upstream_failed)" in r.stdout, r.stdout
        error = next(line for line in r.stdout.splitlines() if " ERROR " in line)
        assert error.endswith("task: Task failed with exception"), error
        after = r.stdout[r.stdout.find(error) :]
        assert "    Traceback (most recent call last):" in after, after
        assert re.search(r'^ +File ".*/dagtrain/launch/launcher.py", line \d+, in', after, re.M)
        assert "    RankFailure: rank 1 was killed by SIGKILL" in after, after
        assert "kills itself" in after
    # the try the training operator recorded before it launched the ranks (the page's tries)
    from dagtrain.records.layout import ArtifactLayout

    metrics = (
        ArtifactLayout(airflow["art"] / "tiny_fail", "dagtrain_tiny_fail")
        .run(failed_run)
        .train.metrics
    )
    kinds = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [(k["kind"], k.get("try")) for k in kinds[:2]] == [("try", 1), ("start", None)]


@pytest.mark.parametrize("url", [False, True], ids=["home", "rest"])
def test_what_does_not_exist_is_named_with_what_does(airflow, url):
    run_id = tiny_run_id(airflow)
    r = logs(airflow, "manual__nope", url=url)
    assert r.returncode == 2 and "no run 'manual__nope'" in r.stderr, r.stderr
    assert run_id in r.stderr, r.stderr  # the newest runs are named
    r = logs(airflow, run_id, "trian", url=url)
    assert r.returncode == 2, r.stderr
    assert "no task 'trian'; its tasks: prepare_data, train, evaluate, promote" in r.stderr
    r = logs(airflow, run_id, "train", "--try", "3", url=url)
    assert r.returncode == 2 and "train has no try 3; its tries: 1" in r.stderr, r.stderr
    r = logs(airflow, run_id, "train[1]", url=url)
    assert r.returncode == 2 and "not a mapped task" in r.stderr, r.stderr
    r = logs(airflow, run_id, "--try", "1", url=url)
    assert r.returncode == 2 and "give one TASK" in r.stderr, r.stderr
    r = logs(airflow, run_id, "train", "--dag", "dagtrain_nope", url=url)
    assert r.returncode == 2 and "of DAG 'dagtrain_nope'" in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_home_without_a_database_says_to_run_first(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DAGTRAIN_AIRFLOW_URL", None)
    r = subprocess.run(
        [*DAGTRAIN, "logs", "manual__1", "--home", str(tmp_path / "h")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no Airflow database" in r.stderr and "dagtrain run" in r.stderr, r.stderr
    assert "--url" in r.stderr and not (tmp_path / "h").exists()  # nothing made


def test_log_files_are_where_airflow_wrote_each_try(airflow, failed_run):
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from dagtrain.cli.common import home_of\n"
        "home_of(Path(sys.argv[1])).activate()\n"
        "from dagtrain.cli.logs import log_files\n"
        "print(json.dumps({d: [(t, n, str(p)) for t, n, p in log_files(d, r)]"
        " for d, r in zip(sys.argv[2::2], sys.argv[3::2])}))\n"
    )
    argv = [sys.executable, "-c", code, str(airflow["home"])]
    argv += ["dagtrain_tiny", tiny_run_id(airflow), "dagtrain_tiny_fail", failed_run]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    base = (airflow["home"] / "logs" / "airflow").resolve()
    for dag_id, files in got.items():
        for task, n, path in files:
            p = Path(path)
            assert p.is_absolute() and p.is_relative_to(base) and p.name == f"attempt={n}.log"
            assert p.exists() and f"task_id={task}" in p.parts[-2], p
            assert p.read_text().startswith('{"timestamp"'), p  # Airflow's JSON lines
        assert f"dag_id={dag_id}" in files[0][2]
    assert [(t, n) for t, n, _ in got["dagtrain_tiny"]] == [(t, 1) for t in TASKS]
    # evaluate and promote never ran: no try, no file
    assert [(t, n) for t, n, _ in got["dagtrain_tiny_fail"]] == [("prepare_data", 1), ("train", 1)]
