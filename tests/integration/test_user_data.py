"""The user's own data: a Dataset factory and an object-storage URL train to the same
parameters as the equivalent .npz, on 1 and 2 ranks; a killed run resumes bit for bit;
every source that cannot work is refused naming data.source (or data.connection)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from dagtrain.config import TrainConfig, load_config
from dagtrain.errors import InputError, MissingDependency
from dagtrain.launch import RankFailure
from dagtrain.phases.prep import prepare, prepare_phase
from dagtrain.phases.train import train_phase
from dagtrain.training import run_training

from . import user_data
from .faults import alive, signal_rank

FACTORY = "tests.integration.user_data:dataset"
QUIET = {"on_line": lambda line: None}


def pipeline(tmp_path: Path, source: str, ranks: int, extra: str = "") -> object:
    name = f"p{abs(hash((source, ranks, extra))) % 10**8}"
    p = tmp_path / f"{name}.yaml"
    p.write_text(
        f"name: {name}\nartifacts: {{root: art}}\n"
        f"data: {{source: '{source}'{extra}}}\n"
        "model: {name: mlp, args: {hidden: [32]}}\n"
        "training: {epochs: 2, batch_size: 64}\n"
        f"distributed: {{backend: torch, ranks: {ranks}, collective_timeout: 60}}\n"
    )
    return load_config(p)


def trained(cfg) -> dict:
    return train_phase(cfg, "run1", prepare_phase(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_factory_and_a_file_url_train_to_the_npz_parameters(tmp_path, ranks):
    npz = tmp_path / "digits.npz"
    user_data.save_npz(npz)
    reference = trained(pipeline(tmp_path, str(npz), ranks))
    for source, extra in [
        (FACTORY, ""),
        (FACTORY, ", workers: 2"),  # DataLoader worker processes read the items
        ("tests.integration.user_data:arrays", ""),
        (npz.as_uri(), ""),  # file://, through Airflow's ObjectStoragePath
    ]:
        got = trained(pipeline(tmp_path, source, ranks, extra))
        assert got["params_sha256"] == reference["params_sha256"], (source, extra)
        assert got["epochs"] == reference["epochs"], (source, extra)


def test_a_factory_split_holds_indices_and_the_url_is_copied_and_checksummed(tmp_path):
    import hashlib

    m = prepare(pipeline(tmp_path, FACTORY, 1))
    assert m["source_kind"] == "factory" and m["in_shape"] == [1, 8, 8] and m["classes"] == 10
    with np.load(Path(m["dir"]) / m["files"]["train"]["path"]) as z:
        assert "x" not in z.files and len(z["index"]) == m["files"]["train"]["rows"]
        assert str(z["factory"]) == FACTORY
    npz = tmp_path / "digits.npz"
    user_data.save_npz(npz)
    u = prepare(pipeline(tmp_path, npz.as_uri(), 1))
    copy = Path(u["copy"]["path"])
    assert copy.read_bytes() == npz.read_bytes()
    assert u["copy"]["sha256"] == hashlib.sha256(npz.read_bytes()).hexdigest()
    assert u["source_digest"] == u["copy"]["sha256"]


@pytest.mark.slow
def test_a_killed_run_on_a_dataset_resumes_bitwise(tmp_path, monkeypatch):
    cfg = dict(
        backend="torch",
        data=FACTORY,
        data_workers=1,
        model="tests.unit.training.factory:slow",
        model_args={"seconds": 0.01},
        epochs=3,
        max_steps=90,
        checkpoint_every=10,
        batch_size=32,
        collective_timeout=60,
    )
    whole = run_training(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a")), 2, **QUIET)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(pids))
    d = tmp_path / "b"
    killer = signal_rank(d, pids, 1, signal.SIGKILL, "ckpt-00000020.pt.json", {})
    with pytest.raises(RankFailure):
        run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), 2, on_start=killer, **QUIET)
    time.sleep(0.5)
    assert not [p for p in pids.iterdir() if alive(int(p.read_text()))], "orphaned ranks"
    monkeypatch.delenv("DAGTRAIN_PID_DIR")
    resumed = run_training(TrainConfig(**cfg, checkpoint_dir=str(d)), 2, **QUIET)
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 20
    assert resumed.steps == whole.steps == 90
    assert resumed.params_sha256 == whole.params_sha256


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("tests.integration.nothere:dataset", "cannot import the factory"),
        ("tests.integration.user_data:nothere", "has no 'nothere'"),
        ("tests.integration.user_data:number", "returned int, not a torch.utils.data.Dataset"),
        ("tests.integration.user_data:stream", "IterableDataset"),
        ("tests.integration.user_data:single", "item 0 is a tuple of 1"),
        ("tests.integration.user_data:ragged", "item 300's features have shape"),
        ("tests.integration.user_data:fractional", "item 0's label is 0.5"),
        ("tests.integration.user_data:text", "item 0's features are"),
        ("tests.integration.user_data:raises", "bucket credentials expired (at "),
        ("zz://bucket/x.npz", "zz:// is not a storage scheme"),
        ("file:///nonexistent/x.npz", "no such object"),
    ],
)
def test_a_source_that_cannot_work_is_refused_naming_the_field(tmp_path, source, needle):
    with pytest.raises(InputError, match=r"data\.source") as info:
        prepare(pipeline(tmp_path, source, 1))
    assert needle in str(info.value)


def test_with_workers_a_dataset_that_does_not_pickle_is_refused_naming_both_fields(tmp_path):
    # DataLoader workers start from a fork server (never by forking a rank that runs
    # threads: see dagtrain.training.rank.samples._workers), so they receive the Dataset pickled
    cfg = pipeline(tmp_path, "tests.integration.user_data:unpicklable", 1, ", workers: 2")
    with pytest.raises(InputError, match=r"data\.source.*data\.workers") as info:
        prepare(cfg)
    assert "does not pickle" in str(info.value)
    prepare(pipeline(tmp_path, "tests.integration.user_data:unpicklable", 1))  # 0 workers


def test_a_url_whose_filesystem_is_not_installed_says_what_to_install(tmp_path):
    pytest.importorskip("fsspec")
    import importlib.util

    if importlib.util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed here")
    with pytest.raises(MissingDependency, match=r"data.source 's3://b/x.npz'.*s3fs"):
        prepare(pipeline(tmp_path, "s3://b/x.npz", 1))


def test_an_unknown_data_connection_is_refused_naming_it(tmp_path):
    npz = tmp_path / "digits.npz"
    user_data.save_npz(npz)
    cfg = pipeline(tmp_path, npz.as_uri(), 1, ", connection: no_such_conn")
    with pytest.raises(InputError, match=r"data\.connection.*'no_such_conn'") as info:
        prepare(cfg)
    assert "--conn-type generic" in str(info.value)  # file://: no cloud's type


def test_a_run_conf_cannot_choose_the_source_or_its_connection(tmp_path):
    from dagtrain.config import ConfigError, merge_conf

    cfg = pipeline(tmp_path, FACTORY, 1)
    for conf in ({"data": {"source": "os:getcwd"}}, {"data": {"connection": "other"}}):
        with pytest.raises(ConfigError, match="only in the pipeline's config file"):
            merge_conf(cfg, conf)


def test_how_a_source_is_read_is_not_part_of_the_data_version(tmp_path):
    a = prepare(pipeline(tmp_path, FACTORY, 1))
    b = prepare(pipeline(tmp_path, FACTORY, 1, ", workers: 2"))
    assert a["version"] == b["version"]
