"""Which failures a task retries: the project's own input errors and a missing
dependency fail at once; anything else (a ValueError from torch too) is retried."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest

from dagtrain.errors import InputError, MissingDependency
from dagtrain.operators import DataPrepOperator, DistributedTrainOperator
from dagtrain.operators._base import BadInput, fails_fast_on_bad_input


class _Op:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    @fails_fast_on_bad_input
    def execute(self, context):
        raise self.error


@pytest.mark.parametrize("error", [InputError("data x: bad"), MissingDependency("no horovod")])
def test_the_projects_input_errors_fail_without_retry(error):
    with pytest.raises(BadInput) as info:
        _Op(error).execute({})
    assert info.value.__cause__ is error and str(error) in str(info.value)


def test_a_value_error_of_someone_else_keeps_its_type_and_is_retried():
    error = ValueError("Expected input batch_size (3) to match target batch_size (4).")
    with pytest.raises(ValueError) as info:
        _Op(error).execute({})
    assert info.value is error and not isinstance(info.value, BadInput)


def test_horovod_missing_fails_the_task_at_once_with_the_install_command(tmp_path, monkeypatch):
    """Also: a task puts the process's ``sys.path`` back (the config's folder is on it
    for the task's own imports only), whether it returned or failed."""
    cfg = tmp_path / "h.yaml"
    path = list(sys.path)
    cfg.write_text(
        "name: h\ndata: {source: digits}\ndistributed: {backend: horovod, ranks: 2}\n"
        f"artifacts: {{root: {tmp_path / 'art'}}}\n"
    )
    ctx = {"run_id": "manual__h", "dag_run": SimpleNamespace(conf={}), "outlet_events": {}}
    data = DataPrepOperator(task_id="prep", config=cfg).execute(ctx)
    assert sys.path == path
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a)
    )
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(tmp_path))  # a rank that started writes here
    with pytest.raises(BadInput, match=r"horovod is not installed.*make horovod") as info:
        DistributedTrainOperator(task_id="train", config=cfg, data=data).execute(ctx)
    assert isinstance(info.value.__cause__, MissingDependency)
    assert not list(tmp_path.glob("rank*.pid")), "a rank started"
    assert sys.path == path
