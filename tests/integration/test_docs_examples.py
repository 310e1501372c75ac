"""The training examples in README.md, docs/training.md and docs/parallelism.md run as
written (real ranks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
pytestmark = pytest.mark.slow


def first_block(doc: str, heading: str | None = None) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    if heading is not None:
        assert f"\n{heading}\n" in text, f"{doc} lost its section {heading!r}"
        text = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return BLOCK.findall(text)[0]


@pytest.mark.parametrize(
    ("doc", "heading"), [("README.md", "## Training in ten lines"), ("docs/training.md", None)]
)
def test_the_training_example_runs(doc, heading, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__example__"}
    exec(compile(first_block(doc, heading), doc, "exec"), ns)
    result = ns["result"]
    assert result.world == 2 and result.test_accuracy > 0.9
    assert result.config == ns["cfg"].model_dump(mode="json")  # what the ranks received
    assert list((tmp_path / "ckpt").glob("ckpt-*.pt"))


def test_the_pipeline_example_runs_and_its_yaml_is_the_example_dags(tmp_path, monkeypatch):
    import yaml

    from dagtrain.config import load_config, validate

    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__example__"}
    exec(compile(first_block("docs/parallelism.md"), "docs/parallelism.md", "exec"), ns)
    result = ns["result"]
    p = result.pipeline
    assert (p["stages"], p["microbatches"], p["order"], p["stage"]) == (2, 4, "1f1b", 0)
    assert result.world == 2 and result.test_accuracy > 0.5
    text = (ROOT / "docs/parallelism.md").read_text(encoding="utf-8")
    block = re.search(r"^```yaml\n(.*?)^```$", text, re.S | re.M).group(1)
    shown = validate({"name": "example", **yaml.safe_load(block)})
    dag = load_config(ROOT / "dags/transformer_pipeline.yaml")
    assert shown.parallel == dag.parallel and shown.model == dag.model


def test_the_elastic_yaml_is_an_elastic_config():
    import yaml

    from dagtrain.config import validate

    text = (ROOT / "docs/elastic.md").read_text(encoding="utf-8")
    block = re.search(r"^```yaml\n(.*?)^```$", text, re.S | re.M).group(1)
    cfg = validate({"name": "example", **yaml.safe_load(block)})
    d = cfg.distributed
    assert d.elastic and (d.ranks, d.fewest_ranks, d.max_world_changes, d.regrow) == (3, 2, 4, True)


def test_the_elastic_pipeline_yaml_is_an_elastic_pipeline_config():
    import yaml

    from dagtrain.config import validate

    block = _block("docs/elastic.md", "# an elastic pipeline")
    cfg = validate({"name": "example", **yaml.safe_load(block)})
    d, p = cfg.distributed, cfg.parallel
    assert d.elastic and (d.ranks, d.fewest_ranks, p.stages) == (4, 2, 2)
    # one more replica would need a batch of 4 x 3 x ... : 32 does not split 3 ways
    with pytest.raises(Exception, match="on each of 3 replica"):
        validate({"name": "x", **yaml.safe_load(block.replace("ranks: 4 ", "ranks: 6 "))})


def _block(doc: str, first_line: str) -> str:
    """The fenced block of ``doc`` whose first line is ``first_line``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    for body in re.findall(r"^```\w*\n(.*?)^```$", text, re.S | re.M):
        if body.startswith(first_line + "\n"):
            return body
    raise AssertionError(f"{doc} lost its block {first_line!r}")


def test_the_guides_dataset_example_validates_prepares_and_trains(tmp_path, monkeypatch):
    import subprocess
    import sys

    from dagtrain.config import load_config
    from dagtrain.phases.prep import prepare_phase
    from dagtrain.phases.train import train_phase

    (tmp_path / "my_dataset.py").write_text(_block("docs/guide.md", "# my_dataset.py"))
    cfg_file = tmp_path / "my_dataset_pipeline.yaml"
    cfg_file.write_text(_block("docs/guide.md", "# my_dataset_pipeline.yaml"))
    dagtrain = [sys.executable, "-m", "dagtrain"]
    out = subprocess.run(
        [*dagtrain, "validate", str(cfg_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    monkeypatch.setenv("DAGTRAIN_HOME", str(tmp_path / "home"))
    cfg = load_config(cfg_file)
    assert cfg.data.workers == 2 and cfg.distributed.ranks == 2
    data = prepare_phase(cfg)
    result = train_phase(cfg, "docs", data, code_dirs=(str(tmp_path),))
    assert result["world"] == 2 and result["val_accuracy"] > 0.9, result


def test_the_guides_own_objective_validates_trains_and_decides_promotion(tmp_path, monkeypatch):
    import subprocess
    import sys

    from dagtrain.config import load_config
    from dagtrain.phases.prep import prepare_phase
    from dagtrain.phases.registry import evaluate_phase
    from dagtrain.phases.train import train_phase

    (tmp_path / "my_objective.py").write_text(_block("docs/guide.md", "# my_objective.py"))
    cfg_file = tmp_path / "my_objective_pipeline.yaml"
    cfg_file.write_text(_block("docs/guide.md", "# my_objective_pipeline.yaml"))
    out = subprocess.run(
        [sys.executable, "-m", "dagtrain", "validate", str(cfg_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    monkeypatch.setenv("DAGTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.syspath_prepend(str(tmp_path))  # as the DAGs folder is for a task
    cfg = load_config(cfg_file)
    data = prepare_phase(cfg)
    result = train_phase(cfg, "docs", data, code_dirs=(str(tmp_path),))
    assert result["world"] == 2
    last = result["epochs"][-1] if "epochs" in result else None
    ev = evaluate_phase(cfg, "docs", data, result)
    m = ev["metrics"]
    assert {"test_within", "test_mae", "test_loss", "test_abs_error"} <= set(m), m
    assert 0.5 < m["test_within"] <= 1 and m["test_units"] == m["test_samples"], (m, last)
    assert ev["better"] and ev["reason"] == "the first model: no champion yet", ev
    # a metric the objective does not report is refused before anything runs, named
    bad = cfg_file.read_text().replace("metric: test_within", "metric: test_r2")
    cfg_file.write_text(bad)
    out = subprocess.run(
        [sys.executable, "-m", "dagtrain", "validate", str(cfg_file)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "evaluation.metric 'test_r2'" in out.stderr, out.stderr
    assert "test_within, test_mae, test_loss" in out.stderr, out.stderr


def test_the_language_model_example_of_training_md_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # its text is the project's, dags/data/corpus.txt
    code = _block("docs/training.md", "from dagtrain.training import TrainConfig, train")
    ns: dict = {"__name__": "__example__"}
    exec(compile(code, "docs/training.md", "exec"), ns)
    row = ns["result"].epochs[-1]
    assert 1 < row["test_perplexity"] < 30 and row["train_accuracy"] > 0.1, row


def test_the_recipe_example_of_training_md_runs():
    code = _block(
        "docs/training.md",
        "# the recipe: warmup and cosine decay, clipping, accumulation, early stopping",
    )
    ns: dict = {"__name__": "__example__"}
    exec(compile(code, "docs/training.md", "exec"), ns)
    result, cfg = ns["result"], ns["cfg"]
    lrs = [row["lr"] for row in result.epochs]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(0.0003)  # to the minimum
    assert all(0 <= row["clip_rate"] <= 1 and row["grad_norm"] > 0 for row in result.epochs)
    assert result.early_stop["metric"] == "test_loss" and cfg.training.accumulation_steps == 2
    assert result.epochs[-1]["test_accuracy"] > 0.9, result.epochs[-1]


def test_the_recipe_sections_yaml_validates():
    import yaml

    from dagtrain.config import validate

    text = (ROOT / "docs/training.md").read_text(encoding="utf-8")
    section = text.split("\n## The recipe", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```$", section, re.S | re.M)
    assert blocks, "docs/training.md's recipe section lost its YAML"
    guide = (ROOT / "docs/guide.md").read_text(encoding="utf-8")
    blocks += [b for b in re.findall(r"^```yaml\n(.*?)^```$", guide, re.S | re.M) if "init:" in b]
    assert len(blocks) >= 2, "docs/guide.md lost its warm-start YAML"
    for block in blocks:
        cfg = validate(yaml.safe_load(block))
        assert cfg.training.init in ("champion", "scratch") or cfg.training.init.endswith(".pt")
