"""Champion / challenger: only a better model is promoted; every one is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dagtrain.config import load_config
from dagtrain.errors import InputError
from dagtrain.phases.registry import better, champion, evaluation_of, promote
from dagtrain.records.layout import ArtifactLayout
from dagtrain.records.registry import RegistryEntry
from dagtrain.training.rank import checkpoint


def cfg_with(tmp_path, evaluation: str = ""):
    p = tmp_path / "p.yaml"
    p.write_text(f"name: r\nartifacts: {{root: art}}\nevaluation: {{{evaluation}}}\n")
    return load_config(p)


def run_folder(cfg) -> Path:
    """A run's checkpoint folder under the pipeline's artifact root."""
    return ArtifactLayout.of(cfg).run("r1").train.checkpoints


def test_better_follows_the_metric_its_direction_and_the_margins(tmp_path):
    acc = cfg_with(tmp_path, "min_improvement: 0.01, threshold: 0.5")
    champ = RegistryEntry(1, "", metrics={"test_accuracy": 0.90, "test_loss": 0.3})
    assert better(acc, {"test_accuracy": 0.92, "test_loss": 0.5}, champ)[0]
    assert not better(acc, {"test_accuracy": 0.905, "test_loss": 0.1}, champ)[0]
    assert not better(acc, {"test_accuracy": 0.4, "test_loss": 0.1}, None)[0]  # floor
    assert better(acc, {"test_accuracy": 0.6, "test_loss": 0.1}, None)[0]  # first one
    loss = cfg_with(tmp_path, "metric: test_loss")
    assert better(loss, {"test_accuracy": 0.1, "test_loss": 0.2}, champ)[0]  # lower wins
    assert not better(loss, {"test_accuracy": 0.99, "test_loss": 0.4}, champ)[0]


def test_promote_records_every_version_and_keeps_the_best_as_champion(tmp_path):
    cfg = cfg_with(tmp_path)
    ckpt = checkpoint.save({"model": {"w": torch.ones(2)}}, run_folder(cfg), 1)
    lineage = {"run_id": "r1", "data_manifest": "m.json"}
    first = promote(cfg, str(ckpt), {"test_accuracy": 0.9, "test_loss": 0.3}, lineage)
    second = promote(cfg, str(ckpt), {"test_accuracy": 0.8, "test_loss": 0.5}, lineage)
    third = promote(cfg, str(ckpt), {"test_accuracy": 0.95, "test_loss": 0.2}, lineage)
    assert [first["promoted"], second["promoted"], third["promoted"]] == [True, False, True]
    assert champion(cfg).version == 3
    reg = json.loads((cfg.artifact_root() / "registry" / "registry.json").read_text())
    assert [v["version"] for v in reg["versions"]] == [1, 2, 3]
    assert reg["versions"][1]["lineage"] == lineage and reg["versions"][2]["previous_champion"] == 1
    assert torch.equal(torch.load(third["path"], weights_only=True)["w"], torch.ones(2))


@pytest.mark.parametrize(
    "bad",
    ["<img src=x onerror=alert(1)>", float("nan"), float("inf"), True, None, [0.99]],
    ids=["html", "nan", "inf", "bool", "none", "list"],
)
def test_a_metric_that_is_not_a_finite_number_is_refused_by_name_and_nothing_registered(
    tmp_path, bad
):
    """The metrics reach promote through the evaluate task's XCom, which a user who may
    write XComs (Airflow's REST API) could rewrite between evaluate and promote."""
    cfg = cfg_with(tmp_path)
    ckpt = checkpoint.save({"model": {"w": torch.ones(2)}}, run_folder(cfg), 1)
    with pytest.raises(InputError, match=r"evaluation metric 'test_loss' is .*not a finite"):
        promote(cfg, str(ckpt), {"test_accuracy": 0.9, "test_loss": bad}, {"run_id": "r1"})
    assert champion(cfg) is None
    assert not (cfg.artifact_root() / "registry" / "registry.json").exists()


def test_a_checkpoint_outside_the_pipelines_artifact_root_is_never_registered(tmp_path):
    """promote's checkpoint comes from the run's evaluation; a path elsewhere (another
    pipeline's model, any file) is refused by name and nothing is registered."""
    cfg = cfg_with(tmp_path)
    other = checkpoint.save({"model": {"w": torch.ones(2)}}, tmp_path / "elsewhere", 1)
    with pytest.raises(InputError, match=r"checkpoint: .* is not under the pipeline's artifact"):
        promote(cfg, str(other), {"test_accuracy": 0.9, "test_loss": 0.3}, {"run_id": "r1"})
    assert not (cfg.artifact_root() / "registry" / "registry.json").exists()
    # a path that only starts inside: .. out of the root
    sneaky = cfg.artifact_root() / "runs" / ".." / ".." / ".." / "elsewhere" / other.name
    with pytest.raises(InputError, match="is not under the pipeline's artifact root"):
        promote(cfg, str(sneaky), {"test_accuracy": 0.9, "test_loss": 0.3}, {"run_id": "r1"})


def test_promote_reads_the_runs_evaluation_file_not_the_xcom(tmp_path):
    cfg = cfg_with(tmp_path)
    with pytest.raises(InputError, match="run 'r1' has no evaluation: run its evaluate task"):
        evaluation_of(cfg, "r1")
    path = ArtifactLayout.of(cfg).run("r1").evaluation
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"checkpoint": "c.pt", "metrics": {"test_accuracy": 0.5}}))
    assert evaluation_of(cfg, "r1").metrics == {"test_accuracy": 0.5}


def test_evaluate_refuses_a_checkpoint_outside_the_pipelines_artifact_root(tmp_path):
    """The train task's XCom names the checkpoint evaluate reads: one elsewhere (another
    pipeline's, any file) is refused by name before it is read."""
    from dagtrain.phases.prep import prepare_phase
    from dagtrain.phases.registry import evaluate_phase

    cfg = cfg_with(tmp_path)
    other = checkpoint.save({"model": {"w": torch.ones(2)}}, tmp_path / "elsewhere", 1)
    data = prepare_phase(cfg)
    with pytest.raises(InputError, match=r"model: .* is not under the folder of run 'r1'"):
        evaluate_phase(cfg, "r1", data, {"checkpoint": str(other)})
    # another run's checkpoint, inside the pipeline's root: not this run's either
    theirs = checkpoint.save({"model": {"w": torch.ones(2)}}, run_folder(cfg).parents[2] / "r0", 1)
    with pytest.raises(InputError, match=r"model: .* is not under the folder of run 'r1'"):
        evaluate_phase(cfg, "r1", data, {"checkpoint": str(theirs)})
    assert not ArtifactLayout.of(cfg).run("r1").evaluation.exists()
