"""A run's files are declared once: the layout type builds every path and names what
any path under the artifact root is; file names read back what built them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagtrain.records.layout import (
    ArtifactLayout,
    RunLayout,
    round_sync_task,
    round_train_task,
    shard_split,
)
from dagtrain.records.names import CHECKPOINT, EPOCH_TRACE, LAST_TRACE, RANK_RECORD, Name

ROOT = Path("/art/digits")


def test_a_name_builds_and_reads_back_its_fields():
    assert CHECKPOINT(step=120) == "ckpt-00000120.pt"
    assert CHECKPOINT.match("ckpt-00000120.pt") == {"step": 120}
    assert CHECKPOINT.match("ckpt-00000120.pt.json") is None
    assert EPOCH_TRACE(step=20, rank=1) == "step0000020-rank1.json"
    assert EPOCH_TRACE.match("step0000020-rank1.json") == {"step": 20, "rank": 1}
    assert EPOCH_TRACE.match("step-rank1.json") is None
    assert LAST_TRACE.match("step-rank12.json") == {"rank": 12}
    assert (
        RANK_RECORD.match("rank3.json") == {"rank": 3} and RANK_RECORD.match("rankx.json") is None
    )
    assert Name("{split}.npz").match("shard-01.npz") == {"split": "shard-01"}
    assert Name("{split}.npz").match("a/b.npz") is None  # one path component


def test_the_layout_places_every_file_of_a_run():
    lay = ArtifactLayout(ROOT, "dagtrain_digits")
    run = lay.run("manual__2026-11-30T04:32:18+00:00")
    assert (
        run.dir == ROOT / "runs" / "dagtrain_digits" / "manual__2026-11-30T04~3a32~3a18~2b00~3a00"
    )
    assert run.train.result == run.dir / "train" / "result.json"
    assert run.train.failure(2) == run.dir / "train" / "failure-try2.json"
    assert run.train.ranks == run.dir / "train" / "ranks"
    assert run.evaluation == run.dir / "eval.json"
    assert run.shard(1, 3).delta == run.dir / "rounds" / "round-01" / "shard-03" / "delta.pt"
    assert run.global_checkpoint(2) == run.dir / "rounds" / "global" / "ckpt-00000002.pt"
    assert run.round_result(1) == run.dir / "rounds" / "round-01" / "global.json"
    assert lay.data("abc").split(shard_split(2)) == ROOT / "data" / "abc" / "shard-02.npz"
    assert lay.model(3) == ROOT / "registry" / "models" / "v0003" / "model.pt"
    assert lay.registry_file == ROOT / "registry" / "registry.json"
    assert ArtifactLayout.of_data_root(ROOT / "data").root == ROOT.resolve()


@pytest.mark.parametrize(
    ("rel", "what"),
    [
        ("data/abc/train.npz", "prepared data"),
        ("data/abc/manifest.json", "prepared data"),
        ("runs/d/r/train/config.json", "run train config"),
        ("runs/d/r/train/metrics.jsonl", "run train metrics"),
        ("runs/d/r/train/failure-try1.json", "run train failure record"),
        ("runs/d/r/train/checkpoints/ckpt-00000020.pt", "run train checkpoint"),
        ("runs/d/r/train/checkpoints/ckpt-00000020.pt.json", "run train checkpoint"),
        ("runs/d/r/train/traces/step-rank0.json", "run train step trace"),
        ("runs/d/r/train/traces/step0000020-rank1.json", "run train step trace"),
        ("runs/d/r/train/ranks/rank1.json", "run train rank record"),
        ("runs/d/r/eval.json", "run evaluation"),
        ("runs/d/r/rounds/global/ckpt-00000001.pt", "round global checkpoint"),
        ("runs/d/r/rounds/round-00/global.json", "round result"),
        ("runs/d/r/rounds/round-00/shard-01/delta.pt.json", "round shard round delta sidecar"),
        ("runs/d/r/rounds/round-00/shard-01/ranks/rank0.json", "round shard rank record"),
        ("registry/registry.json", "registry"),
        ("registry/mlflow.json", "registry mlflow record"),
        ("runs/d/r/mlflow.json", "run mlflow record"),
        ("runs/d/r/mlflow-pending.json", "run mlflow record"),
        ("data/sources/0123456789ab.npz", "source copy"),
        ("registry/models/v0001/model.pt.json", "registered model"),
        ("runs/d/r/train/notes.txt", None),
        ("runs/d/r/train/checkpoints/latest.pt", None),
        ("runs/d/r/rounds/round-00/shard-01/traces/x.json", None),
        ("data/abc/extra/train.npz", None),
        ("runs/r/eval.json", None),  # a run's folder is its DAG's
        ("elsewhere.json", None),
    ],
)
def test_the_layout_names_what_a_path_is_and_nothing_else(rel, what):
    assert ArtifactLayout(ROOT).describe(ROOT / rel) == what


def test_a_path_outside_the_root_is_not_in_the_layout():
    assert ArtifactLayout(ROOT).describe("/elsewhere/runs/d/r/eval.json") is None


def test_two_dags_of_one_config_never_share_a_run_folder():
    """One config may build several DAGs (a DAG file with its own dag_id beside the
    generated one); a run id a triggering user chooses for one DAG cannot be another's
    folder, so it never resumes from that run's checkpoints or reuses its MLflow run.
    Data and registry stay the pipeline's, shared."""
    from dagtrain.config import validate

    cfg = validate({"name": "digits", "artifacts": {"root": str(ROOT)}})
    a, b = ArtifactLayout.of(cfg), ArtifactLayout.of(cfg.for_dag("digits_hourly"))
    assert (a.dag_id, b.dag_id) == ("dagtrain_digits", "digits_hourly")
    run = "scheduled__2026-01-05T00:00:00+00:00"
    assert a.run(run).dir != b.run(run).dir
    assert a.run(run).dir.parent.parent == b.run(run).dir.parent.parent == a.runs
    # the DAG's id made safe as the run's is: no dag id reaches another's folder
    assert ArtifactLayout(a.root, "../x").run(run).dir.parent.parent == a.runs
    assert (a.registry, a.data_root) == (b.registry, b.data_root)
    with pytest.raises(ValueError, match="its DAG's"):
        ArtifactLayout(ROOT).run(run)


def test_what_is_found_on_disk_is_read_back_by_number(tmp_path):
    run = RunLayout(tmp_path)
    for k in (0, 1):
        run.shard(1, k).ranks.mkdir(parents=True)
        (run.shard(1, k).ranks / RANK_RECORD(rank=k)).write_text("{}")
    run.train.traces.mkdir(parents=True)
    for name in ("step-rank0.json", "step0000020-rank0.json", "step0000020-rank1.json", "x"):
        (run.train.traces / name).write_text("{}")
    run.train.failure(3).write_text("{}")
    assert run.round_numbers() == [1]
    assert list(run.shards_of(1)) == [0, 1]
    assert list(run.shard(1, 1).rank_records()) == [1]
    assert [t.dir for t in run.training_folders()] == [
        run.train.dir,
        run.shard(1, 0).dir,
        run.shard(1, 1).dir,
    ]
    traces = run.train.trace_files()
    assert sorted(traces, key=str) == [20, None] and sorted(traces[20]) == [0, 1]
    assert list(run.train.failures()) == [3]


def test_the_tasks_are_named_once():
    assert round_train_task(2) == "round_2_train" and round_sync_task(2) == "round_2_sync"
    assert RunLayout.task_of("rounds/round-01/shard-03/metrics.jsonl") == ("round_1_train", 3)
    assert RunLayout.task_of("train/metrics.jsonl") == ("train", -1)


@given(st.text(), st.text())
def test_two_run_ids_never_share_a_folder(a, b):
    """A run id chosen to look like another run's folder (a triggering user may choose
    one) gets a folder of its own: the encoding is injective, one path component that
    is not hidden, ``.`` or ``..``."""
    from dagtrain.records.layout import safe_name

    for s in (a, b):
        name = safe_name(s)
        assert "/" not in name and "\\0" not in name and not name.startswith(".")
    assert (safe_name(a) == safe_name(b)) == (a == b)


def test_a_chosen_run_id_does_not_take_a_scheduled_runs_folder():
    from dagtrain.records.layout import safe_name

    scheduled = safe_name("scheduled__2026-01-05T00:00:00+00:00")
    assert safe_name("scheduled__2026-01-05T00_00_00_00_00") != scheduled
    assert safe_name("scheduled__2026-01-05T00~3a00~3a00~2b00~3a00") != scheduled


def test_a_run_id_of_any_length_is_one_file_name():
    """Airflow's run ids reach 250 characters; each escaped one takes 3 to 12: a long
    one is a prefix and the digest of the whole, within a file name's 255 bytes."""
    from dagtrain.records.layout import safe_name

    a, b = safe_name(":" * 250), safe_name(":" * 249 + "+")
    assert len(a.encode()) <= 255 and len(b.encode()) <= 255 and a != b
    assert a.startswith("~3a~3a") and "~~" in a
    assert "~~" not in safe_name("manual__2026-11-30T04:32:18+00:00")  # short: no digest
