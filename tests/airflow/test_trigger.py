"""``dagtrain trigger`` against the session's Airflow (``conftest.py``): a run followed
with the same stage and epoch lines as ``dagtrain run``; bad input found in a rank ends
the training task at once, one try of three, naming the field; a model module beside
the DAG files reaches the ranks; a misspelt section is named before any run exists."""

from __future__ import annotations

import re

import httpx
import pytest

from .live import trigger

pytestmark = pytest.mark.slow


def _tries(airflow, dag_id: str, run_id: str) -> dict[str, tuple[str, int]]:
    r = httpx.get(
        f"{airflow['url']}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
        headers=airflow["headers"],
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return {t["task_id"]: (t["state"], t["try_number"]) for t in r.json()["task_instances"]}


def _run_id(r) -> str:
    return re.search(r"triggered \S+ run (\S+)", r.stdout).group(1)


def test_wait_shows_the_stage_and_epoch_lines_of_dagtrain_run_in_order(two_epochs_trigger):
    r = two_epochs_trigger
    assert r.returncode == 0, r.stdout + r.stderr
    order = [
        "following it",
        "prepare_data started",
        "prepare_data succeeded in",
        "train started",
        "train epoch 1/2: loss",
        "train epoch 2/2: loss",
        "train succeeded in",
        "evaluate started",
        "evaluate succeeded in",
        "promote ",
        "\nrun manual__",
        "validation accuracy",
        "test accuracy",
    ]
    at = [r.stdout.find(s) for s in order]
    assert -1 not in at and at == sorted(at), (at, r.stdout)
    assert re.search(r"^run manual__\S+: success in [\d.]+ s$", r.stdout, re.M), r.stdout
    assert "\x1b[" not in r.stdout  # piped: plain lines, no live table


@pytest.mark.parametrize(
    ("dag_id", "needle"),
    [
        ("dagtrain_tiny_badargs", "model.args {'hiddn': [16]}: bad model_args"),
        ("dagtrain_tiny_nocuda", "distributed.device is cuda but local rank"),
        ("dagtrain_tiny_rankimport", "model.name 'only_in_tasks:small': cannot import"),
    ],
)
def test_bad_input_met_in_a_rank_fails_the_task_once_naming_the_field(airflow, dag_id, needle):
    import torch

    if dag_id.endswith("nocuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = trigger(airflow, "--wait", "--timeout", "300", dag_id=dag_id)
    assert r.returncode == 1, r.stdout + r.stderr
    tries = _tries(airflow, dag_id, _run_id(r))
    assert tries["train"] == ("failed", 1), tries  # retries: 2 in its file, one try only
    assert needle in r.stdout and "refused its input" in r.stdout, r.stdout
    assert "Airflow will retry it" not in r.stdout, r.stdout
    assert re.search(rf"^failed: train try 1: .*{re.escape(needle)}", r.stderr, re.M), r.stderr


def test_a_model_module_beside_the_dag_files_reaches_the_ranks(airflow):
    r = trigger(airflow, "--wait", "--timeout", "300", dag_id="dagtrain_tiny_mine")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _tries(airflow, "dagtrain_tiny_mine", _run_id(r))["train"] == ("success", 1)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ("trainig.epochs=2", "the run's conf: unknown section 'trainig' — did you mean"),
        ("training.batchsize=2", "unknown field 'batchsize' of training — did you mean"),
    ],
)
def test_a_misspelt_conf_is_refused_by_name_before_any_run_exists(airflow, sets, message):
    before = httpx.get(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns", headers=airflow["headers"]
    ).json()["total_entries"]
    r = trigger(airflow, "--set", sets)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr
    assert "Failed validating" not in r.stderr and "$schema" not in r.stderr
    after = httpx.get(
        f"{airflow['url']}/api/v2/dags/dagtrain_tiny/dagRuns", headers=airflow["headers"]
    ).json()["total_entries"]
    assert after == before
