"""Data prep: a seeded, disjoint split, train-only statistics, shards, checksums."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dagtrain.config import load_config
from dagtrain.phases.prep import prepare, verify_manifest


def config(tmp_path, extra: str = ""):
    p = tmp_path / "p.yaml"
    p.write_text(f"name: d\nartifacts: {{root: art}}\n{extra}")
    return load_config(p)


def arrays(m, name):
    with np.load(f"{m['dir']}/{m['files'][name]['path']}") as z:
        return z["x"], z["y"], tuple(z["in_shape"]), int(z["classes"])


def test_split_is_disjoint_complete_and_normalised_with_train_statistics(tmp_path):
    m = prepare(config(tmp_path), shards=3)
    rows = {k: f["rows"] for k, f in m["files"].items()}
    assert rows["train"] + rows["val"] + rows["test"] == 1797  # sklearn's digits
    assert sum(rows[f"shard-{k:02d}"] for k in range(3)) == rows["train"]
    xtr, _, shape, classes = arrays(m, "train")
    assert shape == (1, 8, 8) and classes == 10
    assert np.allclose(xtr.mean(axis=0), 0, atol=1e-5)  # train statistics
    xte, _, _, _ = arrays(m, "test")
    assert not np.allclose(xte.mean(axis=0), 0, atol=1e-3)  # not the test split's
    # the shards are the training split, each sample once
    shards = np.concatenate([arrays(m, f"shard-{k:02d}")[0] for k in range(3)])
    assert sorted(map(bytes, shards)) == sorted(map(bytes, xtr))


def test_same_data_and_settings_same_version_and_files_are_reused(tmp_path):
    a = prepare(config(tmp_path))
    b = prepare(config(tmp_path))
    assert a["version"] == b["version"] and a["files"] == b["files"]
    c = prepare(config(tmp_path, "data: {seed: 1}\n"))
    assert c["version"] != a["version"]


def test_a_damaged_file_is_detected_and_prepared_again(tmp_path):
    m = prepare(config(tmp_path))
    victim = f"{m['dir']}/train.npz"
    with open(victim, "r+b") as f:
        f.write(b"garbage")
    with pytest.raises(ValueError, match="train"):
        verify_manifest(Path(m["dir"]) / "manifest.json")
    again = prepare(config(tmp_path))
    assert verify_manifest(Path(again["dir"]) / "manifest.json")["version"] == m["version"]


def test_labels_that_are_not_the_classes_0_to_c_minus_1_are_refused_by_name(tmp_path):
    from dagtrain.errors import InputError

    rows = "".join(f"{i},{i % 5},{1 + i % 3}\n" for i in range(30))  # labels 1, 2, 3
    (tmp_path / "d.csv").write_text(rows)
    with pytest.raises(InputError) as info:
        prepare(config(tmp_path, "data: {source: d.csv}\n"))
    msg = str(info.value)
    assert "labels must be the classes 0..C-1, each present" in msg and "d.csv" in msg
    assert "the labels are 1, 2, 3 (missing: 0); relabel them 0..2" in msg
    (tmp_path / "d.csv").write_text(rows.replace(",3\n", ",0\n"))  # 0, 1, 2: fine
    assert prepare(config(tmp_path, "data: {source: d.csv}\n"))["classes"] == 3


def test_a_stage_reads_the_manifest_of_its_own_pipeline_whatever_the_xcom_says(tmp_path):
    """prepare_data's XCom reaches the later tasks, and a user who may trigger runs can
    rewrite it (Airflow's REST API): only its version is read, checked to be a digest,
    and the manifest is the pipeline's own; a manifest naming a file elsewhere is
    refused."""
    import json

    from dagtrain.errors import InputError
    from dagtrain.phases.prep import manifest_of, prepare_phase

    cfg = config(tmp_path)
    out = prepare_phase(cfg)
    (tmp_path / "b").mkdir()
    other = prepare_phase(config(tmp_path / "b", "data: {seed: 1}\n"))  # another pipeline's
    forged = {**out, "manifest": other["manifest"], "dir": other["dir"]}
    assert manifest_of(cfg, forged)["dir"] == out["dir"]  # its own, not the forged one
    for version in ("../../b/art/d/data/" + other["version"], "", None, 7, "A" * 16):
        with pytest.raises(InputError, match="the data's 'version', a hex digest"):
            manifest_of(cfg, {**out, "version": version})
    with pytest.raises(
        InputError, match=f"data version {other['version']} is not prepared in this pipeline's"
    ):
        manifest_of(cfg, {**out, "version": other["version"]})  # not prepared here
    path = Path(out["manifest"])
    m = json.loads(path.read_text())
    m["files"]["train"]["path"] = "/etc/hostname"
    path.write_text(json.dumps(m))
    with pytest.raises(InputError, match=r"data file train of .* is not a file of its folder"):
        manifest_of(cfg, out, ("train",))
