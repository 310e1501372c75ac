"""The CLI's refusals and closing lines, without running Airflow."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dagtrain.cli import app
from dagtrain.cli.summary import outcome_lines
from dagtrain.records.registry import RegistryEntry

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
        ("data: {source: x.dat}\n", "unknown kind of file"),
        ("model: {name: 'no_such_pkg.models:build'}\n", "no module 'no_such_pkg.models'"),
        ("data: {val_fraction: 0.5, test_fraction: 0.45}\n", "leave under 10% for training"),
    ],
)
def test_validate_refuses_what_a_run_would_fail_on_at_once(tmp_path, text, needle):
    (tmp_path / "x.dat").write_text("1,2\n")
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
    from dagtrain.phases.registry import better

    cfg = tmp_path / "p.yaml"
    cfg.write_text("evaluation: {min_improvement: 0.0}\n")
    champ = RegistryEntry(1, "", metrics={"test_accuracy": 0.9694})
    ok, why = better(load_config(cfg), {"test_accuracy": 0.9612}, champ)
    ev = {"metrics": {**METRICS, "test_accuracy": 0.9612}, "champion": 1, "better": ok}
    last = outcome_lines(None, {**ev, "reason": why}, None)[-1]
    assert last == (
        "not promoted: test accuracy 0.9612 does not beat the champion v1's 0.9694 by more than 0.0"
    )


def test_closing_lines_when_below_the_floor(tmp_path):
    from dagtrain.config import load_config
    from dagtrain.phases.registry import better

    cfg = tmp_path / "p.yaml"
    cfg.write_text("evaluation: {threshold: 0.9}\n")
    ok, why = better(load_config(cfg), {"test_accuracy": 0.7354}, None)
    ev = {"metrics": {**METRICS, "test_accuracy": 0.7354}, "champion": None, "better": ok}
    last = outcome_lines(None, {**ev, "reason": why}, None)[-1]
    assert last == "not promoted: test accuracy 0.7354 is below evaluation.threshold 0.9"
    assert not re.search("champion", last)


REGRESSION_ROW = {
    **{"epoch": 2, "train_loss": 6697.6, "train_mse": 6697.6, "train_mae": 62.7, "train_r2": -0.1},
    **{"val_loss": 5260.12, "val_mse": 5260.12, "val_mae": 56.81, "val_r2": 0.1148},
    **{"val_abs_error": 4999.45, "val_target_sum": 13631, "val_units": 88, "val_samples": 88},
}
REGRESSION_TEST = {
    **{"test_loss": 5000.5, "test_mse": 5000.5, "test_mae": 55.25, "test_r2": 0.2},
    **{"test_abs_error": 4917.25, "test_target_sum": 13631, "test_target_squares": 2634331},
    **{"test_units": 89, "test_samples": 89},
}


def test_closing_lines_of_a_regression_name_the_metric_that_promoted_it(tmp_path):
    from dagtrain.config import load_config
    from dagtrain.phases.registry import better

    cfg = tmp_path / "p.yaml"
    cfg.write_text("objective: {name: regression}\ndata: {source: diabetes}\n")
    champ = RegistryEntry(1, "", metrics={**REGRESSION_TEST, "test_mse": 5100.0})
    ok, why = better(load_config(cfg), REGRESSION_TEST, champ)
    assert ok and why.startswith("test mse 5000.5000 beats the champion v1's 5100.0000")
    ev = {"metrics": REGRESSION_TEST, "champion": 1, "better": ok, "reason": why}
    ev["champion_metrics"] = champ.metrics
    # result.json's rows, as the train phase writes them: keys sorted (mae before mse)
    train = {"val_accuracy": None, "epochs": [{}, {}, dict(sorted(REGRESSION_ROW.items()))]}
    assert outcome_lines(train, ev, {"version": 2}) == [
        "validation mse 5260.1200, mae 56.8100, r2 0.1148 (after 3 epoch(s))",
        "test mse 5000.5000 (test mae 55.2500, test r2 0.2000, test loss 5000.5000, "
        "89 test samples)",
        "promoted v2 (test mse 5000.5000), was v1 (5100.0000)",
    ]
    # the caller's evaluation.metric wins over what the evaluation's reason says
    first = {**ev, "champion": None, "champion_metrics": None, "reason": "the first model"}
    lines = outcome_lines(train, first, {"version": 1}, metric="test_r2")
    assert lines[1:] == [
        "test r2 0.2000 (test mse 5000.5000, test mae 55.2500, test loss 5000.5000, "
        "89 test samples)",
        "promoted v1 (test r2 0.2000), the first champion",
    ]


def test_closing_lines_of_a_language_model_lead_with_perplexity(tmp_path):
    from dagtrain.config import load_config
    from dagtrain.phases.registry import better

    tested = {"test_loss": 2.3, "test_perplexity": 9.9742, "test_accuracy": 0.3846}
    tested |= {"test_correct": 100, "test_units": 260, "test_samples": 10}
    cfg = tmp_path / "p.yaml"
    cfg.write_text("objective: {name: language_model}\nevaluation: {min_improvement: 0.0}\n")
    champ = RegistryEntry(1, "", metrics={**tested, "test_perplexity": 9.5})
    ok, why = better(load_config(cfg), tested, champ)
    ev = {"metrics": tested, "champion": 1, "champion_metrics": champ.metrics}
    # no training summary (trigger --wait without the train task's XCom): the reason says
    assert outcome_lines(None, {**ev, "better": ok, "reason": why}, None) == [
        "test perplexity 9.9742 (test accuracy 0.3846, test loss 2.3000, 10 test samples)",
        "not promoted: test perplexity 9.9742 does not beat the champion v1's 9.5000 by "
        "more than 0.0 (lower is better)",
    ]


MODELS = """
import math
from dagtrain.records.registry import RegistryEntry
from torch import nn


def small_mlp(in_shape, classes, width=64):
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.ReLU(), nn.Linear(width, classes)
    )


def huber():  # an objective of the DAG author's own, its loss alone reported
    import torch
    from dagtrain.training.rank.objective import Objective

    class Huber(Objective):
        metrics = {"loss": "min"}

        def loss(self, output, target):
            return torch.nn.functional.cross_entropy(output, target, reduction="sum")

        def compute(self, sums):
            return {"loss": sums["loss"] / sums["units"]}

    return Huber()
"""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model: {name: mlp, args: {hiddn: [8]}}\n", "model.args {'hiddn': [8]}: bad model_args"),
        (
            "model: {name: 'my_models:small_mlp', args: {widht: 8}}\n",
            "unexpected keyword argument 'widht'",
        ),
        ("model: {name: 'my_models:big_mlp'}\n", "module 'my_models' has no 'big_mlp'"),
        ("model: {name: 'not_beside:small_mlp'}\n", "no module 'not_beside' can be imported"),
        ("trainig: {epochs: 3}\n", "unknown section 'trainig' — did you mean 'training'?"),
        # the recipe: digits' 1257 training samples of 64 are 20 steps an epoch
        (
            "training: {epochs: 2, warmup_steps: 40}\n",
            "training.warmup_steps: the warmup (40 steps) is not shorter than the run (40 steps",
        ),
        ("training: {init: models/gone.pt}\n", "training.init: there is no model file"),
        ("training: {init: Champion}\n", "(did you mean champion?)"),
        (
            "training: {precision: fp16}\ndistributed: {device: auto}\n",
            "training.precision fp16 needs a CUDA device and this machine has none",
        ),
        (
            "objective: {name: 'my_models:huber'}\ntraining: {early_stopping: {metric: r2}}\n",
            "training.early_stopping.metric 'r2': objective 'my_models:huber' does not report",
        ),
    ],
)
def test_validate_refuses_what_the_ranks_would_refuse_naming_the_field(tmp_path, text, needle):
    (tmp_path / "my_models.py").write_text(MODELS)  # beside the config: the ranks see it
    cfg = tmp_path / "p.yaml"
    cfg.write_text(text)
    r = runner.invoke(app, ["validate", str(cfg), "--home", str(tmp_path / "home")])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_validate_accepts_a_model_module_beside_the_config_without_pythonpath(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "my_models.py").write_text(MODELS)
    cfg = tmp_path / "p.yaml"
    cfg.write_text("model: {name: 'my_models:small_mlp', args: {width: 8}}\n")
    r = runner.invoke(app, ["validate", str(cfg), "--home", str(tmp_path / "home")])
    assert r.exit_code == 0, r.output
    # no artifacts.root: the home holds them, as `dagtrain run --home` would put them
    assert f"artifacts in {tmp_path / 'home' / 'artifacts' / 'digits'}" in r.output.replace(
        "\n", ""
    )


def test_validate_refuses_cuda_on_a_machine_without_it(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = tmp_path / "p.yaml"
    cfg.write_text("distributed: {device: cuda}\n")
    r = runner.invoke(app, ["validate", str(cfg)])
    assert r.exit_code == 2
    assert "distributed.device is cuda but this machine has no CUDA device" in r.output


def test_validate_refuses_parquet_without_its_reader_and_prints_text_as_written(
    tmp_path, monkeypatch
):
    import importlib.util

    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: {source: d.parquet}\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "pyarrow" else real(n, *a)
    )
    r = runner.invoke(app, ["validate", str(cfg)])
    assert r.exit_code == 2
    assert "data.source 'd.parquet': reading parquet needs pandas and pyarrow" in r.output
    # a message's brackets are text, not console markup: the install command stays whole
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mpi4py" else real(n, *a)
    )
    cfg.write_text("data: {source: digits}\n")
    r = runner.invoke(app, ["validate", str(cfg)])
    assert r.exit_code == 2 and "pip install 'airflow-provider-dagtrain[train]'" in r.output


def test_run_set_names_a_misspelt_section_before_anything_starts(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("name: p\n")
    home = tmp_path / "home"
    r = runner.invoke(app, ["run", str(cfg), "--set", "trainig.epochs=3", "--home", str(home)])
    assert r.exit_code == 2
    # said where the value came from: --set, the word the user typed
    assert "error: --set: unknown section 'trainig' — did you mean 'training'?" in r.output, (
        r.output
    )
    assert not (home / "airflow").exists()  # nothing started


@pytest.mark.parametrize("command", [[], ["run"], ["logs"], ["validate"], ["trigger"], ["up"]])
def test_help_at_80_columns_breaks_only_where_the_terminal_ends(command):
    """A docstring's lines make paragraphs wrapped to the terminal: no line of the help
    is cut where the source breaks (``Ctrl-C`` alone on a line, ``(every task in``)."""
    r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0, r.output
    assert all(len(line) <= 80 for line in r.output.splitlines()), r.output
    # the prose above the tables: a line that ends well short of the width, followed
    # by more of its sentence, is a break the source made
    text = [line.strip() for line in r.output.splitlines() if not set(line) & set("│╭╰")]
    for line, after in zip(text, text[1:], strict=False):
        if line and after and after[0].islower() and not line.endswith((".", ":", ")")):
            assert len(line) > 55, f"broken at {line!r} / {after!r}\n{r.output}"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("data: {source: 'file:///no/such/dir/d.npz'}\n", "data.source 'file:///no/such/dir"),
        (
            "data: {source: digits, connection: aws_default}\n",
            "data.connection 'aws_default' can have no effect",
        ),
        (
            "tracking: {connection: no_such_mlflow_here}\n",
            "tracking.connection: there is no Airflow connection 'no_such_mlflow_here'",
        ),
    ],
)
def test_validate_refuses_what_prepare_data_and_tracking_would_meet(tmp_path, text, needle):
    """validate reaches what the run's tasks will: an object-storage data.source through
    its connection, the tracking connection; a setting that cannot apply is named. No
    home is made."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: p\n{text}")
    r = runner.invoke(app, ["validate", str(cfg), "--home", str(tmp_path / "home")])
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not (tmp_path / "home").exists()


def test_validate_accepts_an_object_storage_source_that_exists(tmp_path):
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: p\ndata: {{source: '{(tmp_path / 'd.npz').as_uri()}'}}\n")
    r = runner.invoke(app, ["validate", str(cfg), "--home", str(tmp_path / "home")])
    assert r.exit_code == 0, r.output


def test_closing_lines_of_an_early_stop_name_where_why_and_the_epoch_kept():
    rows = [
        {"epoch": i, "val_accuracy": a, "val_loss": 1 - a}
        for i, a in enumerate([0.9, 0.95, 0.94, 0.93])
    ]
    stop = {
        "metric": "val_loss", "best_epoch": 1, "best": 0.05, "stopped_after_epoch": 3,
        "patience": 2, "min_delta": 0.0, "why": "...",
    }  # fmt: skip
    ev = {"metrics": METRICS, "champion": None, "better": True, "reason": "..."}
    lines = outcome_lines({"epochs": rows, "early_stop": stop}, ev, {"version": 1})
    assert lines[:3] == [
        "stopped early after epoch 4: val loss did not improve for 2 epoch(s)",
        "kept the best epoch, 2 of 4 (val loss 0.0500)",
        "validation accuracy 0.9500 (after 2 epoch(s))",  # the kept epoch's
    ]
    ran = outcome_lines(
        {"epochs": rows, "early_stop": stop | {"stopped_after_epoch": None}}, ev, None
    )
    assert ran[0] == "kept the best epoch, 2 of 4 (val loss 0.0500)"
    assert all(len(line) <= 80 for line in lines + ran)


def test_a_pipeline_run_closes_with_its_layout_and_the_order_auto_chose():
    trial = {"chosen": "1f1b", "median_step_ms": {"1f1b": 15.823, "gpipe": 16.91}, "why": "."}
    p = {"stages": 2, "replicas": 1, "chunks": 1, "microbatches": 4, "split": [3]}
    train = {"pipeline": {**p, "how": "auto", "order": "1f1b", "order_trial": trial}}
    lines = outcome_lines(train, None, None)
    assert lines == [
        "pipeline: 2 stages x 1 replica, 4 microbatches",
        "pipeline split [3] (auto), order 1f1b (measured: 1f1b 15.8 ms, gpipe 16.9 ms)",
    ]
    assert all(len(line) <= 80 for line in lines)
    # chunks in a V, replicas, a split and an order as set: no measurement to show
    v = {**p, "replicas": 2, "chunks": 2, "placement": "v", "split": [2, 3, 4]}
    train = {"pipeline": {**v, "how": "explicit", "order": "zero-bubble", "order_trial": None}}
    assert outcome_lines(train, None, None) == [
        "pipeline: 2 stages x 2 replicas, 4 microbatches, 2 chunks a rank in a V",
        "pipeline split [2, 3, 4], order zero-bubble",
    ]
    # a run shorter than auto's trial: the order it ran, not as if chosen
    short = {**trial, "chosen": None, "median_step_ms": {}}
    train = {"pipeline": {**p, "how": "auto", "order": "1f1b", "order_trial": short}}
    assert outcome_lines(train, None, None)[1] == (
        "pipeline split [3] (auto), order auto (1f1b: trial unfinished)"
    )
    assert outcome_lines({"pipeline": None, "epochs": [{}]}, None, None) == []
