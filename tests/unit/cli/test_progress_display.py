"""What ``dagtrain run`` and ``trigger --wait`` print, from the events they are fed."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dagtrain.cli.follow import RestFollower, task_order
from dagtrain.cli.progress import Display, label_of


def progress() -> tuple[Display, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, width=80, soft_wrap=True, markup=False, highlight=False)
    return Display(console, "t", None, None, ["prepare_data", "train"]), buf


def ev(kind: str, task: str, t: float, n: int = 1, **kw) -> dict:
    return {"event": kind, "task_id": task, "map_index": -1, "try_number": n, "time": t, **kw}


def test_a_try_airflow_failed_stays_failed_whatever_its_task_runner_says_later():
    # Ctrl-C while prepare_data starts: Airflow marks it failed before its task runner
    # reports that it started, then (terminated) that it succeeded
    p, buf = progress()
    p.stopping = True
    p.feed([ev("failed", "prepare_data", 1.0, state="failed", error="manually set")], [])
    p.feed([ev("running", "prepare_data", 0.5), ev("success", "prepare_data", 2.0)], [])
    assert p.tasks["prepare_data"].state == "failed"
    assert buf.getvalue() == "prepare_data try 1 stopped: the run is marked failed\n"
    p.settle({"prepare_data": ("failed", 1), "train": ("skipped", 0)})
    assert [s.state for s in p.tasks.values()] == ["failed", "skipped"]


def test_a_retried_try_is_followed_by_the_next_one():
    p, buf = progress()
    p.feed(
        [
            ev("running", "train", 1.0),
            ev("failed", "train", 2.0, state="up_for_retry", error="RankFailure: x"),
            ev("running", "train", 3.0, n=2),
            ev("success", "train", 5.0, n=2),
        ],
        [],
    )
    assert buf.getvalue().splitlines() == [
        "train started",
        "train try 1 failed, Airflow will retry it: RankFailure: x",
        "train started (try 2)",
        "train succeeded in 2.0 s",
    ]


def test_a_failed_try_is_one_line_its_ranks_last_lines_left_to_the_task_log():
    p, buf = progress()
    error = (
        "RankFailure: rank 1 was killed by SIGKILL; 0 world change(s) made already in this "
        "try (distributed.max_world_changes): the try fails; the other ranks were stopped.\n"
        "Last lines of its log:\n    {'epoch': 0, 'train_loss': 0.5}\n    {'epoch': 1}"
    )
    p.feed([ev("running", "train", 1.0), ev("failed", "train", 2.0, error=error)], [])
    (line,) = buf.getvalue().splitlines()[1:]
    assert line.startswith("train try 1 failed: RankFailure: rank 1 was killed by SIGKILL; 0 ")
    assert line.endswith("the other ranks were stopped. (more in the task's log)"), line
    assert "{" not in line and p.tasks["train"].error in line


def test_epoch_lines_come_in_time_order_with_the_stage_lines_and_not_once_stopping():
    p, buf = progress()
    start = {"kind": "start", "step": 0, "total_steps": 40, "steps_per_epoch": 20, "time": 1.5}
    epoch = {"kind": "epoch", "epoch": 0, "train_loss": 0.5, "step": 20, "total_steps": 40}
    p.feed(
        [ev("running", "train", 1.0), ev("success", "train", 9.0)],
        [("train", start), ("train", {**epoch, "time": 4.0})],
    )
    lines = buf.getvalue().splitlines()
    assert lines[0] == "train started" and lines[-1] == "train succeeded in 8.0 s"
    assert lines[1].startswith("train epoch 1/2: loss 0.5000"), lines
    p.stopping = True
    p.feed([], [("train", {**epoch, "epoch": 1, "step": 40, "time": 10.0})])
    assert len(buf.getvalue().splitlines()) == 3


def test_an_epoch_line_fits_an_80_column_terminal():
    m = {
        "kind": "epoch",
        "epoch": 1999,
        "train_loss": 0.0002,
        "val_accuracy": 0.9667,
        "samples_per_second": 58001.0,
        "step": 40000,
        "total_steps": 40020,
        "elapsed": 100.0,
    }
    info = {"steps_per_epoch": 20, "step": 0}
    wide = Display._epoch_line("train", info, m)
    assert wide.startswith("train epoch 2000/2001: loss 0.0002, val accuracy 0.9667, 58.0k")
    narrow = Display._epoch_line("round_12_train[3]", info, m, width=80)
    assert len(narrow) < 80 and "val acc 0.9667" in narrow, narrow


# a classification's epoch row with the training recipe's figures: the LR of its last
# step always; the mean gradient norm and the share of steps clipped with max_grad_norm
RECIPE = {
    **{"kind": "epoch", "epoch": 2, "train_loss": 0.1234, "train_accuracy": 0.9},
    **{"val_loss": 0.2, "val_accuracy": 0.9667, "val_correct": 29, "val_samples": 30},
    **{"lr": 0.0032, "grad_norm": 0.78431, "clip_rate": 0.125},
    **{"samples_per_second": 6322.0, "step": 60, "total_steps": 120, "elapsed": 3.0},
}
NO_CLIP = {k: v for k, v in RECIPE.items() if k not in ("grad_norm", "clip_rate")}


@pytest.mark.parametrize(
    ("label", "row", "width", "expected"),
    [
        # piped: all of it, the clipped share said with the norm
        (
            "train",
            RECIPE,
            None,
            "train epoch 3/6: loss 0.1234, val accuracy 0.9667, lr 3.2e-3, "
            "gnorm 0.784 (12% clipped), 6322 samples/s, ETA 3.0 s",
        ),
        # 80 columns: short names, then the clipped share and samples/s go; the norm stays
        (
            "train",
            RECIPE,
            80,
            "train epoch 3/6: loss 0.1234, val acc 0.9667, lr 3.2e-3, gnorm 0.784, ETA 3.0 s",
        ),
        # a round's shard has a longer label: the norm goes too, the LR and the ETA stay
        (
            "round_12_train[3]",
            RECIPE,
            80,
            "round_12_train[3] epoch 3/6: loss 0.1234, val acc 0.9667, lr 3.2e-3, ETA 3.0 s",
        ),
        # narrower still: the ETA goes, never the LR
        ("train", RECIPE, 60, "train epoch 3/6: loss 0.1234, val acc 0.9667, lr 3.2e-3"),
        # without clipping: the LR alone
        (
            "train",
            NO_CLIP,
            None,
            "train epoch 3/6: loss 0.1234, val accuracy 0.9667, lr 3.2e-3, 6322 samples/s, "
            "ETA 3.0 s",
        ),
        # a schedule decayed to nothing, a norm in the thousands, a step in 400 clipped
        (
            "train",
            RECIPE | {"lr": 0.0, "grad_norm": 1534.6, "clip_rate": 0.0025},
            None,
            "train epoch 3/6: loss 0.1234, val accuracy 0.9667, lr 0, "
            "gnorm 1535 (<1% clipped), 6322 samples/s, ETA 3.0 s",
        ),
    ],
)
def test_an_epoch_line_shows_the_lr_and_with_clipping_the_gradient_norm(
    label, row, width, expected
):
    line = Display._epoch_line(label, {"steps_per_epoch": 20, "step": 0}, row, width)
    assert line == expected
    assert width is None or len(line) < width, line


# rank 0's epoch rows of a regression and of a language model: the objective's metrics
# (train_<m>) and, on the validation or test split, each metric and the sums it comes from
REGRESSION = {
    "kind": "epoch",
    "epoch": 1,
    **{"train_loss": 6697.6459, "train_mse": 6697.6459, "train_mae": 62.7104, "train_r2": -0.13},
    **{"val_loss": 5260.1246, "val_mse": 5260.1246, "val_mae": 56.8119, "val_r2": 0.1148},
    **{"val_abs_error": 4999.45, "val_target_sum": 13631, "val_target_squares": 2634331},
    **{"val_units": 88, "val_samples": 88, "samples_per_second": 6322.0},
    **{"step": 40, "total_steps": 160, "elapsed": 3.0},
}
LANGUAGE_MODEL = {
    "kind": "epoch",
    "epoch": 1,
    **{"train_loss": 2.1, "train_perplexity": 8.1662, "train_accuracy": 0.41},
    **{"test_loss": 2.3, "test_perplexity": 9.9742, "test_accuracy": 0.3846},
    **{"test_correct": 100, "test_units": 260, "test_samples": 10},
    **{"samples_per_second": 6322.0, "step": 40, "total_steps": 160, "elapsed": 3.0},
}


def test_a_regression_epoch_line_shows_its_metrics_in_the_objectives_order_not_its_sums():
    info = {"steps_per_epoch": 20, "step": 0}
    wide = Display._epoch_line("train", info, REGRESSION)
    assert wide == (
        "train epoch 2/8: loss 6697.6, val mse 5260.1, val mae 56.8119, val r2 0.1148, "
        "6322 samples/s, ETA 9.0 s"
    )
    assert "abs_error" not in wide and "target" not in wide and "units" not in wide
    narrow = Display._epoch_line("train", info, REGRESSION, width=80)
    assert (
        narrow == "train epoch 2/8: loss 6697.6, val mse 5260.1, mae 56.8119, r2 0.1148, ETA 9.0 s"
    )
    # a round's shard has a longer label: the first metric is kept, and the ETA
    shard = Display._epoch_line("round_12_train[3]", info, REGRESSION, width=80)
    assert shard == "round_12_train[3] epoch 2/8: loss 6697.6, val mse 5260.1, ETA 9.0 s"
    assert len(Display._epoch_line("round_12_train[3]", info, REGRESSION, width=50)) < 60
    # a first epoch's large errors: fewer decimals, so that every metric still fits
    early = {**REGRESSION, "epoch": 0, "train_loss": 9514.43, "val_mae": 103.1234}
    line = Display._epoch_line("train", info, early | {"val_r2": -0.0123, "elapsed": 0.2}, width=80)
    assert line == "train epoch 1/8: loss 9514.4, val mse 5260.1, mae 103.12, r2 -0.0123, ETA 0.6 s"
    # keys in another order (a file written with sorted keys): the objective's order still
    assert Display._epoch_line("train", info, dict(sorted(REGRESSION.items()))) == wide


def test_a_language_models_epoch_line_shows_perplexity_then_accuracy_of_the_test_split():
    info = {"steps_per_epoch": 20, "step": 0}
    wide = Display._epoch_line("train", info, LANGUAGE_MODEL)
    assert wide == (
        "train epoch 2/8: loss 2.1000, test perplexity 9.9742, test accuracy 0.3846, "
        "6322 samples/s, ETA 9.0 s"
    )
    narrow = Display._epoch_line("train", info, LANGUAGE_MODEL, width=80)
    assert narrow == "train epoch 2/8: loss 2.1000, test ppl 9.9742, acc 0.3846, ETA 9.0 s"
    assert len(narrow) < 80


def test_a_classification_row_of_today_prints_as_it_always_has():
    row = {
        **{"kind": "epoch", "epoch": 0, "train_loss": 0.5, "train_accuracy": 0.8},
        **{"val_loss": 0.4, "val_accuracy": 0.85, "val_correct": 85, "val_samples": 100},
        **{"samples_per_second": 812.0, "step": 20, "total_steps": 40, "elapsed": 2.0},
    }
    line = Display._epoch_line("train", {"steps_per_epoch": 20, "step": 0}, row)
    assert line == "train epoch 1/2: loss 0.5000, val accuracy 0.8500, 812 samples/s, ETA 2.0 s"


def test_piped_a_regressions_epoch_line_stays_whole():
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=False, markup=False, highlight=False)
    p = Display(console, "t", None, None, ["train"])
    p.feed([], [("train", {**REGRESSION, "time": 2.0})])
    (line,) = buf.getvalue().splitlines()
    assert line.endswith("val mae 56.8119, val r2 0.1148, 6322 samples/s, ETA 9.0 s"), line
    assert "\x1b" not in buf.getvalue()


def test_the_stages_are_in_the_dags_order_and_a_shards_metrics_named_by_its_task():
    tasks = [
        {"task_id": "promote", "downstream_task_ids": []},
        {"task_id": "evaluate", "downstream_task_ids": ["promote"]},
        {"task_id": "train", "downstream_task_ids": ["evaluate"]},
        {"task_id": "prepare_data", "downstream_task_ids": ["train", "evaluate"]},
        {"task_id": "round_0_train", "downstream_task_ids": [], "is_mapped": True},
    ]
    assert task_order(tasks) == ["prepare_data", "train", "evaluate", "promote"]
    assert label_of("rounds/round-01/shard-00/metrics.jsonl") == "round_1_train[0]"
    assert label_of("train/metrics.jsonl") == "train"


class _Client:
    """The REST API as a run goes: each poll, the next list of task instances."""

    def __init__(self, polls: list[list[dict]]) -> None:
        self.polls = polls

    def run(self, dag_id, run_id):
        return {"state": "running"}

    def task_instances(self, dag_id, run_id):
        return self.polls.pop(0)

    def error_of(self, dag_id, run_id, ti):
        return f"RankFailure: try {ti['try_number']}"

    def progress(self, dag_id, run_id, after):
        return []


def test_a_try_that_ended_between_two_polls_still_gets_its_events():
    def ti(state, n, start=None, end=None):
        return {
            "task_id": "train",
            "map_index": -1,
            "state": state,
            "try_number": n,
            "start_date": start,
            "end_date": end,
        }

    client = _Client(
        [
            [ti("running", 1, "2026-12-01T10:00:00Z")],
            [ti("running", 2, "2026-12-01T10:00:09Z")],  # try 1 failed and was retried
            [ti("success", 2, "2026-12-01T10:00:09Z", "2026-12-01T10:00:19Z")],
        ]
    )
    f = RestFollower(client, "d", "r")
    kinds = []
    for _ in range(3):
        _, events, _ = f.poll()
        kinds += [(e["event"], e["try_number"], e.get("state")) for e in events]
    assert kinds == [
        ("running", 1, None),
        ("failed", 1, "up_for_retry"),
        ("running", 2, None),
        ("success", 2, None),
    ]


def test_an_elastic_world_change_is_a_line_and_its_relaunch_is_not_a_resume():
    p, buf = progress()
    start = {"kind": "start", "step": 0, "total_steps": 96, "steps_per_epoch": 48}
    shrink = {
        "kind": "world",
        "change": "shrink",
        "step": 57,
        "from": 3,
        "to": 2,
        "why": "rank 1 was killed by SIGKILL",
        "seconds": 5.28,
        "steps_lost": 1,
    }
    p.feed(
        [ev("running", "train", 1.0), ev("success", "train", 9.0)],
        [
            ("train", {"kind": "try", "try": 1, "time": 1.1}),
            ("train", {**start, "resumed_from_step": None, "time": 1.5}),
            ("train", {**start, "step": 57, "resumed_from_step": 57, "time": 6.0}),
            ("train", {**shrink, "time": 6.5}),
        ],
    )
    lines = buf.getvalue().splitlines()
    # piped (no terminal): one line
    whole = (
        "train world 3 -> 2 ranks at step 57: rank 1 was killed by SIGKILL "
        "(recovered in 5.3 s, 1 step lost)"
    )
    assert whole in lines, lines
    assert not any("resumed from step" in line for line in lines), lines
    # in an 80-column terminal: the figures on a line of their own, nothing cut
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, soft_wrap=True, no_color=True)
    p = Display(console, "t", None, None, ["train"])
    p.feed([ev("running", "train", 1.0)], [("train", {**shrink, "time": 6.5})])
    shown = [x.rstrip() for x in buf.getvalue().splitlines() if "world" in x or "recov" in x]
    assert shown[0] == "train world 3 -> 2 ranks at step 57: rank 1 was killed by SIGKILL"
    assert shown[1].strip() == "recovered in 5.3 s, 1 step lost", shown
    assert all(len(x) < 80 for x in shown), shown


def test_polled_files_give_their_lines_in_the_order_things_happened(tmp_path):
    # the task's end was in the events file before the poll read its last epoch: the
    # epoch line still comes first, as from the REST API (feed)
    import json

    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps(e) + "\n" for e in (ev("running", "train", 1.0), ev("success", "train", 9.0))
        )
    )
    metrics = tmp_path / "run" / "train" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    start = {"kind": "start", "step": 0, "total_steps": 40, "steps_per_epoch": 20, "time": 1.5}
    last = {"kind": "epoch", "epoch": 1, "train_loss": 0.25, "step": 40, "total_steps": 40}
    metrics.write_text(json.dumps(start) + "\n" + json.dumps(last | {"time": 8.5}) + "\n")
    buf = io.StringIO()
    console = Console(file=buf, width=80, soft_wrap=True, markup=False, highlight=False)
    p = Display(console, "t", events, tmp_path / "run", ["prepare_data", "train"])
    p.poll()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "train started" and lines[-1].startswith("train succeeded"), lines
    assert any(line.startswith("train epoch 2/2") for line in lines[1:-1]), lines
