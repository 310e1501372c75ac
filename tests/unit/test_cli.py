"""The CLI's refusals and closing lines, without running Airflow."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dagtrain.cli import app
from dagtrain.cli.summary import outcome_lines

runner = CliRunner()


def test_validate_names_a_missing_data_file_and_exits_2(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: {source: nowhere/train.csv}\n")
    r = runner.invoke(app, ["validate", str(cfg)])
    assert r.exit_code == 2
    assert "data.source 'nowhere/train.csv': no such file" in r.output, r.output
    assert str(tmp_path / "nowhere" / "train.csv") in r.output.replace("\n", "")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("data: {source: x.txt}\n", "unknown kind of file"),
        ("model: {name: 'no_such_pkg.models:build'}\n", "no module 'no_such_pkg.models'"),
        ("data: {val_fraction: 0.5, test_fraction: 0.45}\n", "leave under 10% for training"),
    ],
)
def test_validate_refuses_what_a_run_would_fail_on_at_once(tmp_path, text, needle):
    (tmp_path / "x.txt").write_text("1,2\n")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(text)
    r = runner.invoke(app, ["validate", str(cfg)])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_validate_accepts_the_example(tmp_path):
    r = runner.invoke(app, ["validate", "dags/digits_retraining.yaml"])
    assert r.exit_code == 0 and r.output.startswith("ok "), r.output


def test_version():
    from dagtrain import __version__

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"dagtrain {__version__}"


TRAIN = {"val_accuracy": 0.9611, "epochs": [{}, {}, {}]}
METRICS = {"test_accuracy": 0.9712, "test_loss": 0.0912, "test_samples": 359}


def test_closing_lines_when_promoted_over_a_champion():
    ev = {"metrics": METRICS, "champion": 2, "champion_metrics": {"test_accuracy": 0.9694}}
    lines = outcome_lines(TRAIN, {**ev, "better": True, "reason": "..."}, {"version": 3})
    assert lines == [
        "validation accuracy 0.9611 (after 3 epoch(s))",
        "test accuracy 0.9712 (test loss 0.0912, 359 test samples)",
        "promoted v3 (0.9712), was v2 (0.9694)",
    ]


def test_closing_lines_when_not_better_than_the_champion(tmp_path):
    from dagtrain.config import load_config
    from dagtrain.stages.registry import better

    cfg = tmp_path / "p.yaml"
    cfg.write_text("evaluation: {min_improvement: 0.0}\n")
    champ = {"version": 1, "metrics": {"test_accuracy": 0.9694}}
    ok, why = better(load_config(cfg), {"test_accuracy": 0.9612}, champ)
    ev = {"metrics": {**METRICS, "test_accuracy": 0.9612}, "champion": 1, "better": ok}
    last = outcome_lines(None, {**ev, "reason": why}, None)[-1]
    assert last == "not promoted: test accuracy 0.9612 does not beat v1's 0.9694 by more than 0.0"


def test_closing_lines_when_below_the_floor(tmp_path):
    from dagtrain.config import load_config
    from dagtrain.stages.registry import better

    cfg = tmp_path / "p.yaml"
    cfg.write_text("evaluation: {min_accuracy: 0.9}\n")
    ok, why = better(load_config(cfg), {"test_accuracy": 0.7354}, None)
    ev = {"metrics": {**METRICS, "test_accuracy": 0.7354}, "champion": None, "better": ok}
    last = outcome_lines(None, {**ev, "reason": why}, None)[-1]
    assert last == "not promoted: test accuracy 0.7354 is below evaluation.min_accuracy 0.9"
    assert not re.search("champion", last)
