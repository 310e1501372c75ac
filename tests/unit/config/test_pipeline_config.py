"""The pipeline config: YAML in, clear errors, one schema for files, conf and Params."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagtrain.config import (
    ConfigError,
    PipelineConfig,
    apply_sets,
    config_schema,
    dag_params,
    load_config,
    merge_conf,
)


def write(tmp_path, text: str):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_a_file_loads_with_defaults_and_paths_relative_to_it(tmp_path):
    cfg = load_config(write(tmp_path, "name: x\ntraining: {epochs: 2}\n"))
    assert cfg.training.epochs == 2 and cfg.distributed.backend == "mpi"
    assert cfg.artifact_root() == (tmp_path / "../.dagtrain/artifacts/x").resolve()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("training: {epochs: 0}", "training.epochs"),
        ("training: {epoch: 3}", "training.epoch: unknown field"),
        ("distributed: {backend: nccl2}", "distributed.backend"),
        ("model: {name: resnet}", "model.name"),
        ("data: {val_fraction: 1.5}", "data.val_fraction"),
        ("- a\n- b", "top level must be a mapping"),
        ("training: {epochs: [1", "not valid YAML"),
    ],
)
def test_errors_name_the_field_path(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(write(tmp_path, text))
    assert needle in str(info.value), str(info.value)


def test_yaml_is_read_safely(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "name: !!python/object/apply:os.system ['true']\n"))


def test_conf_merges_into_the_file_and_keeps_what_it_does_not_name(tmp_path):
    cfg = load_config(write(tmp_path, "training: {epochs: 7, lr: 0.1}\n"))
    run = merge_conf(cfg, {"training": {"epochs": 2}})
    assert (run.training.epochs, run.training.lr) == (2, 0.1)
    assert run.base_dir == cfg.base_dir


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"model": {"name": "evil.module:build"}}, "model.name"),
        ({"artifacts": {"root": "/etc"}}, "artifacts.root"),
        ({"distributed": {"hosts": ["attacker:4"]}}, "distributed.hosts"),
        ({"bogus": {}}, "unknown section 'bogus'"),
        ({"training": {"epochs": -1}}, "training.epochs"),
        # what decides promotion: a conf could otherwise make any model the champion
        ({"evaluation": {"threshold": 0.0}}, "evaluation"),
        ({"evaluation": {"metric": "test_loss"}}, "evaluation"),
        ({"data": {"test_fraction": 0.01}}, "data.test_fraction"),
        # the bound on what model.args (which a conf may change) ask of the workers
        ({"model": {"max_parameters": 10**12}}, "model.max_parameters"),
    ],
)
def test_a_runs_conf_cannot_name_code_or_places(tmp_path, conf, needle):
    cfg = load_config(write(tmp_path, "model: {name: mlp}\nevaluation: {threshold: 0.8}\n"))
    with pytest.raises(ConfigError) as info:
        merge_conf(cfg, conf)
    assert needle in str(info.value)


def test_a_conf_may_repeat_the_files_evaluation_and_test_split(tmp_path):
    cfg = load_config(write(tmp_path, "evaluation: {threshold: 0.8}\n"))
    run = merge_conf(cfg, {"evaluation": {"threshold": 0.8}, "data": {"test_fraction": 0.2}})
    assert run.evaluation == cfg.evaluation and run.data.test_fraction == 0.2


def test_the_files_own_factory_may_be_repeated_by_conf(tmp_path):
    cfg = load_config(write(tmp_path, "model: {name: 'tests.unit.training.factory:tiny'}\n"))
    assert merge_conf(cfg, {"model": {"name": cfg.model.name}}).model.name == cfg.model.name
    assert merge_conf(cfg, {"model": {"name": "cnn"}}).model.name == "cnn"


def test_set_overrides_parse_scalars_and_are_validated():
    cfg = PipelineConfig()
    conf = apply_sets(cfg, ["training.epochs=3", "distributed.overlap=false", "model.args={}"])
    assert conf == {
        "training": {"epochs": 3},
        "distributed": {"overlap": False},
        "model": {"args": {}},
    }
    with pytest.raises(ConfigError, match=r"training\.epochs"):
        apply_sets(cfg, ["training.epochs=zero"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_sets(cfg, ["training.epochs"])


def test_schema_has_every_section_inlined():
    s = config_schema()
    assert "$defs" not in s and "$ref" not in str(s)
    assert s["properties"]["training"]["properties"]["epochs"]["minimum"] == 1


def test_params_refuse_a_bad_conf_naming_the_field(tmp_path):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    cfg = load_config(write(tmp_path, "training: {epochs: 4}\n"))
    params = ParamsDict(dag_params(cfg))
    assert params.validate()["training"]["epochs"] == 4  # the file's values are the defaults
    for bad, needle in [
        ({"training": {"epochs": 0}}, "training"),
        ({"training": {"epochs": 2, "typo": 1}}, "typo"),
        ({"model": {"name": "os:system"}}, "model"),
        ({"artifacts": {"root": "/tmp/elsewhere"}}, "artifacts"),
    ]:
        p = ParamsDict(dag_params(cfg))
        with pytest.raises(ParamValidationError) as info:
            for k, v in bad.items():  # checked as it is set, or at validate()
                p[k] = v
            p.validate()
        assert needle in str(info.value), str(info.value)
    ok = ParamsDict(dag_params(cfg))
    ok["training"] = {"epochs": 2}  # part of a section: the rest stays the file's
    assert ok.validate()["training"] == {"epochs": 2}


def test_the_config_reference_in_docs_is_generated_from_the_schema():
    from pathlib import Path

    from dagtrain.docs import config_reference

    doc = Path(__file__).parents[3] / "docs" / "config.md"
    assert doc.read_text() == config_reference(), "run: dagtrain schema --markdown > docs/config.md"


def test_every_example_config_validates():
    from pathlib import Path

    for f in sorted((Path(__file__).parents[3] / "dags").glob("*.yaml")):
        cfg = load_config(f)
        assert cfg.distributed.backend != "horovod", f"{f}: the quick start must not need Horovod"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("distributed: {backend: local, ranks: 2}", "distributed.ranks is 2"),
        ("training: {batch_size: 2}\ndistributed: {ranks: 4}", "training.batch_size 2"),
        (
            "data: {workers: 64}\ndistributed: {ranks: 16}\ntraining: {batch_size: 64}",
            "data.workers 64 with distributed.ranks 16 start 1024 DataLoader processes",
        ),
    ],
)
def test_checks_across_fields_name_both(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, text))


def test_a_section_the_pipeline_does_not_use_is_neither_offered_nor_accepted(tmp_path):
    from dagtrain.config import merge_conf
    from dagtrain.config.params import fixed_sections

    cfg = load_config(write(tmp_path, "training: {epochs: 4}\n"))
    fixed = fixed_sections(cfg)
    assert set(fixed) == {
        *(
            "name",
            "pipeline",
            "schedule",
            "artifacts",
            "rounds",
            "tracking",
            "evaluation",
            "objective",
        ),
    }
    assert "not used by a retraining pipeline" in fixed["rounds"]
    params = dag_params(cfg)
    assert params["rounds"].schema == {"const": cfg.model_dump(mode="json")["rounds"]}
    assert params["training"].description and all(
        f.get("description") for f in params["training"].schema["properties"].values()
    )
    with pytest.raises(ConfigError, match="rounds does not apply to a retraining pipeline"):
        merge_conf(cfg, {"rounds": {"local_steps": 3}})
    same = cfg.model_dump(mode="json")["rounds"]  # the form sends the hidden value back
    assert merge_conf(cfg, {"rounds": same, "training": {"epochs": 2}}).training.epochs == 2
    rounds = load_config(write(tmp_path, "pipeline: rounds\n"))
    assert "rounds" not in fixed_sections(rounds)
    assert merge_conf(rounds, {"rounds": {"local_steps": 3}}).rounds.local_steps == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trainig:\n  epochs: 3\n", "unknown section 'trainig' — did you mean 'training'?"),
        ("modle: {name: mlp}\n", "unknown section 'modle' — did you mean 'model'?"),
        (
            "training: {batchsize: 32}\n",
            "training.batchsize: unknown field 'batchsize' of training — did you mean "
            "'batch_size'?",
        ),
    ],
)
def test_a_misspelt_section_or_field_is_named_with_the_name_meant(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value), str(info.value)


def test_a_runs_conf_names_a_misspelt_section_as_a_file_does(tmp_path):
    cfg = load_config(write(tmp_path, "model: {name: mlp}\n"))
    with pytest.raises(ConfigError) as info:
        merge_conf(cfg, {"trainig": {"epochs": 3}})
    assert str(info.value) == (
        "the run's conf: unknown section 'trainig' — did you mean 'training'?"
    )
    with pytest.raises(ConfigError) as info:
        merge_conf(cfg, {"zzz": {}})
    assert "unknown section 'zzz' (known: artifacts, data, " in str(info.value)


def test_without_artifacts_root_a_dagtrain_home_holds_the_artifacts(tmp_path, monkeypatch):
    cfg = load_config(write(tmp_path, "name: x\n"))
    monkeypatch.delenv("DAGTRAIN_HOME", raising=False)
    assert cfg.artifact_root() == (tmp_path / "../.dagtrain/artifacts/x").resolve()
    monkeypatch.setenv("DAGTRAIN_HOME", str(tmp_path / "home"))
    assert cfg.artifact_root() == tmp_path / "home" / "artifacts" / "x"
    assert cfg.artifact_root(tmp_path / "h2") == tmp_path / "h2" / "artifacts" / "x"
    pinned = load_config(write(tmp_path, "name: x\nartifacts: {root: art}\n"))
    assert pinned.artifact_root() == tmp_path / "art" / "x"  # the file's own: beside it


def test_a_presigned_data_url_is_shown_without_its_query_and_still_read_whole(tmp_path):
    """A presigned ``data.source`` (its query string grants access): the DAG's
    description and Params and the lineage values show it without the query; the trigger
    form sends the Params back as the conf, which is the file's value, and the run
    reads the whole URL."""
    from dagtrain.config import merge_conf
    from dagtrain.pipelines import retraining_dag

    url = "https://bucket.example.com/d.csv?X-Amz-Signature=SECRET"
    cfg_file = write(tmp_path, f"data: {{source: '{url}'}}\n")
    cfg = load_config(cfg_file)
    shown = "https://bucket.example.com/d.csv?***"
    assert cfg.shown()["data"]["source"] == shown and cfg.data.source == url
    params = dag_params(cfg)
    assert "SECRET" not in json.dumps(params["data"].dump() | params["data"].schema)
    dag = retraining_dag(cfg_file)
    assert "SECRET" not in dag.description and shown in dag.description
    run = merge_conf(cfg, {"data": params["data"].value, "training": {"epochs": 1}})
    assert run.data.source == url and run.training.epochs == 1


def test_a_conf_merges_into_model_args_unless_it_names_another_model(tmp_path):
    """``--set model.args.heads=2`` changes one argument and keeps the file's others;
    a conf that names another model gives that model's arguments whole."""
    from dagtrain.config import apply_sets, merge_conf

    cfg = load_config(
        write(tmp_path, "model: {name: transformer, args: {dim: 64, heads: 4, layers: 4}}\n")
    )
    run = merge_conf(cfg, apply_sets(cfg, ["model.args.heads=2"]))
    assert run.model.args == {"dim": 64, "heads": 2, "layers": 4}
    run = merge_conf(cfg, {"model": {"name": "mlp", "args": {"hidden": [8]}}})
    assert run.model.name == "mlp" and run.model.args == {"hidden": [8]}
    run = merge_conf(cfg, apply_sets(cfg, ["model.name=mlp"]))  # its own defaults
    assert run.model.name == "mlp" and run.model.args == {}


def test_a_field_of_several_types_is_one_sentence_of_what_is_allowed(tmp_path):
    """pydantic reports each member of a union; the user reads one line a field."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "parallel: {stages: 2, split: '3'}\ndistributed: {ranks: 2}"))
    lines = str(info.value).splitlines()[1:]
    assert lines == ["  parallel.split: should be 'auto' or a valid list (got '3')"], lines
    with pytest.raises(ConfigError, match=r"training.epochs: should be greater than or equal"):
        load_config(write(tmp_path, "training: {epochs: 0}"))


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).parents[3] / "dags").glob("*.yaml")), ids=lambda p: p.name
)
def test_trigger_config_sends_what_the_dags_params_accept(example):
    """``dagtrain trigger --config FILE``: the file's sections less every file-only field
    (the whole of a pinned section: evaluation) pass the DAG's Params as Airflow checks
    a conf (each section's value against its schema)."""
    import yaml

    from dagtrain.config import FILE_ONLY, without_file_only

    cfg = load_config(example)
    params = dag_params(cfg)
    conf = without_file_only(yaml.safe_load(example.read_text()))
    assert "evaluation" not in conf and "name" not in conf
    for section, value in conf.items():
        params[section].resolve(value=value)  # raises ParamValidationError if refused
    for dotted in FILE_ONLY:
        head, _, field = dotted.partition(".")
        assert head not in conf or (field and field not in conf[head]), dotted
