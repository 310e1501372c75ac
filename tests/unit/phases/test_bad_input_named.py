"""Every bad input is refused by name: the field, the file or the model, and what to do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from dagtrain.config import PipelineConfig, TrainConfig
from dagtrain.errors import InputError


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"seed": -1}, "training.seed"),
        ({"seed": 10**15}, "training.seed"),
        ({"lr": float("inf")}, "training.lr"),
        ({"lr": float("nan")}, "training.lr"),
        ({"epochs": 10**9}, "training.epochs"),
        ({"batch_size": 10**12}, "training.batch_size"),
        ({"bucket_mb": 1e12}, "distributed.bucket_mb"),
        ({"collective_timeout": float("inf")}, "distributed.collective_timeout"),
        ({"intra_op_threads": 10**6}, "executor.intra_op_threads"),
        ({"retry_delay_seconds": 1e30}, "training.retry_delay_seconds"),
        ({"timeout_minutes": 1e30}, "training.timeout_minutes"),
        ({"weight_decay": float("-inf")}, "training.weight_decay"),
    ],
)
def test_numbers_that_would_break_numpy_torch_or_airflow_are_refused_by_field(kw, field):
    with pytest.raises(ValidationError) as info:
        TrainConfig(**kw)
    locs = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert field in locs, locs


def test_every_accepted_seed_works():
    from dagtrain.training.rank.data import load_dataset, shard_batches

    for seed in (0, 2**32 - 1):
        PipelineConfig.model_validate({"training": {"seed": seed}, "data": {"seed": seed}})
        shard_batches(100, 10, 0, 2, seed, 7)
        load_dataset("digits", 0.2, seed)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "the CSV file is empty"),
        ("   \n\n", "the CSV file is empty"),
        ("a,b,label\n", "a header row and no data rows"),
        ("a,b,label\n1,2,0\n3,x,1\n", "column(s) 2 hold text or empty cells (first at data row 2"),
        ("1,2,0\n3,,1\n", "column(s) 2 hold text or empty cells"),
        ("1\n2\n", "one column"),
    ],
)
def test_a_bad_csv_is_refused_naming_the_file_and_the_problem(tmp_path, text, needle):
    from dagtrain.training.rank.data import read_arrays

    f = tmp_path / "d.csv"
    f.write_text(text)
    with pytest.raises(InputError) as info:
        read_arrays(str(f))
    assert needle in str(info.value) and str(f) in str(info.value), str(info.value)


def test_a_negative_width_names_the_model_and_its_args():
    from dagtrain.training.rank.models import build_model

    with pytest.raises(InputError) as info:
        build_model("mlp", (1, 8, 8), 10, hidden=[-8])
    msg = str(info.value)
    assert "model 'mlp'" in msg and "model.args" in msg and "{'hidden': [-8]}" in msg, msg


def test_a_garbage_checkpoint_with_a_matching_sidecar_is_not_a_checkpoint(tmp_path):
    import hashlib

    from dagtrain.training.rank import checkpoint

    data = b"\x80\x04\x95garbage that is not a torch file" * 10
    p = tmp_path / "ckpt-00000001.pt"
    p.write_bytes(data)
    sidecar = {"step": 1, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (tmp_path / "ckpt-00000001.pt.json").write_text(json.dumps(sidecar))
    with pytest.raises(InputError) as info:
        checkpoint.load(p)
    msg = str(info.value)
    assert "is not a dagtrain checkpoint" in msg and "weights_only=False" not in msg, msg
    assert checkpoint.latest(tmp_path) is None  # skipped, not loaded


@pytest.mark.parametrize("extra", [{"max_steps": 3}, {"eval_data": "EVAL", "test_fraction": 0}])
def test_the_training_cli_ends_well_without_an_epoch_or_a_test_split(tmp_path, extra):
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 2, 64)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    extra = {k: str(tmp_path / "d.npz") if v == "EVAL" else v for k, v in extra.items()}
    cfg = {"data": str(tmp_path / "d.npz"), "epochs": 1, "batch_size": 8, **extra}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "dagtrain.training", "--config", str(tmp_path / "run.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert ("no accuracy yet" in last) if "max_steps" in extra else ("validation accuracy" in last)


def test_the_training_command_names_a_bad_flag_as_validate_does(capsys):
    from dagtrain.training.__main__ import main

    assert main(["--ranks", "2", "--backend", "mpi", "--epochs", "0", "--quiet"]) == 2
    said = capsys.readouterr().err
    # one line a field, not pydantic's dump (its type names and URL)
    assert "training.epochs: should be greater than or equal to 1 (got 0)" in said, said
    assert "pydantic" not in said and "validation error" not in said, said
