"""Warm start (``training.init``): the train phase's resolution (the champion, none yet,
a file, a model that does not fit), the rank's own check, the model files it reads, the
conf rule, the lineage it leaves and the line ``dagtrain run`` closes with."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from dagtrain.cli.summary import init_line, outcome_lines
from dagtrain.config import ConfigError, TrainConfig, dag_params, load_config, merge_conf
from dagtrain.errors import InputError
from dagtrain.phases.registry import champion, promote
from dagtrain.phases.train import resolve_init
from dagtrain.records.layout import ArtifactLayout
from dagtrain.records.registry import init_said
from dagtrain.training.rank import checkpoint
from dagtrain.training.rank.models import DataInfo, build_model
from dagtrain.training.rank.warmstart import check_fits, initial_weights, load_weights

MANIFEST = {"in_shape": [64], "classes": 10}


def cfg_of(tmp_path, init: str = "champion", hidden: int = 8, extra: str = ""):
    p = tmp_path / "p.yaml"
    p.write_text(
        f"name: w\nartifacts: {{root: art}}\nmodel: {{name: mlp, args: {{hidden: [{hidden}]}}}}\n"
        f"training: {{init: {init!r}}}\n{extra}"
    )
    return load_config(p)


def model_of(hidden: int = 8) -> torch.nn.Module:
    info = DataInfo.of(MANIFEST, "classification")
    return build_model("mlp", (64,), 10, info, hidden=[hidden])


def promoted(cfg, hidden: int = 8, run_id: str = "r0", acc: float = 0.9) -> tuple[int, dict]:
    """A champion of ``hidden`` units registered (as promote does); its version and
    state."""
    state = model_of(hidden).state_dict()
    folder = ArtifactLayout.of(cfg).run(run_id).train.checkpoints
    ckpt = checkpoint.save({"model": state}, folder, 1)
    entry = promote(cfg, str(ckpt), {"test_accuracy": acc, "test_loss": 0.3}, {"run_id": run_id})
    return entry["version"], state


# -- the train phase's resolution --------------------------------------------------------


def test_champion_resolves_to_its_model_file_and_the_ranks_config_accepts_it(tmp_path):
    cfg = cfg_of(tmp_path)
    version, state = promoted(cfg)
    init_from, training, record = resolve_init(cfg, MANIFEST)
    assert record == {
        "kind": "champion",
        "version": version,
        "path": champion(cfg).path,
        "note": None,
    }
    assert init_from == champion(cfg).path and training.init == "champion"
    tcfg = cfg.train_config(training=training, init_from=init_from)
    model = model_of()
    initial_weights(tcfg, model)  # the rank: the champion's weights, checked and loaded
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_no_champion_yet_trains_from_scratch_with_a_note(tmp_path):
    cfg = cfg_of(tmp_path)
    logged: list[str] = []

    class Log:
        def info(self, *a):
            logged.append(a[0] % a[1:])

        warning = info

    init_from, training, record = resolve_init(cfg, MANIFEST, log=Log())
    assert init_from is None and training.init == "scratch"
    assert record["kind"] == "scratch" and "no champion yet" in record["note"]
    assert any("training from scratch" in line for line in logged), logged
    # what the ranks receive: scratch (champion with no file is a rank's to refuse:
    # test_recipe's test_champion_without_a_registry_is_refused_by_a_rank_alone)
    assert cfg.train_config(training=training).training.init == "scratch"


def test_a_file_resolves_against_the_config_file_and_a_missing_one_is_refused(tmp_path):
    torch.save(model_of().state_dict(), tmp_path / "warm.pt")
    cfg = cfg_of(tmp_path, "warm.pt")
    init_from, training, record = resolve_init(cfg, MANIFEST)
    assert init_from == str((tmp_path / "warm.pt").resolve())
    assert record["kind"] == "file" and record["path"] == init_from
    assert training.init == "warm.pt"
    gone = cfg_of(tmp_path, "gone.pt")
    with pytest.raises(InputError, match=r"^training.init: there is no model file .*gone\.pt"):
        resolve_init(gone, MANIFEST)


def test_a_champion_of_another_architecture_is_refused_naming_the_parameter(tmp_path):
    cfg = cfg_of(tmp_path, hidden=8)
    version, _ = promoted(cfg, hidden=16)
    with pytest.raises(InputError) as e:
        resolve_init(cfg, MANIFEST)
    said = str(e.value)
    assert said.startswith(f"training.init champion v{version}: its weights do not fit")
    assert "parameter '1.weight' is [16, 64] there and [8, 64]" in said
    assert "set training.init: scratch for a new architecture" in said


def test_a_file_with_other_parameters_is_refused_naming_them(tmp_path):
    torch.save({"encoder.weight": torch.zeros(2, 2)}, tmp_path / "other.pt")
    with pytest.raises(InputError, match=r"training.init file 'other.pt'.*lacks '1.weight'"):
        resolve_init(cfg_of(tmp_path, "other.pt"), MANIFEST)


def test_a_retry_starts_where_the_first_try_resolved_not_from_a_newer_champion(tmp_path):
    cfg = cfg_of(tmp_path)
    first, _ = promoted(cfg)
    keep = tmp_path / "task"
    keep.mkdir()
    _, _, record = resolve_init(cfg, MANIFEST, keep_in=keep)
    newer, _ = promoted(cfg, run_id="r9", acc=0.99)  # promoted while the task was between tries
    assert champion(cfg).version == newer != first
    again, _, kept = resolve_init(cfg, MANIFEST, keep_in=keep)
    assert kept == record and kept["version"] == first and again == record["path"]


def test_the_rank_refuses_weights_that_do_not_fit_naming_training_init(tmp_path):
    torch.save(model_of(16).state_dict(), tmp_path / "wide.pt")
    tcfg = TrainConfig(model={"name": "mlp", "args": {"hidden": [8]}}, training={"init": "x"})
    tcfg = tcfg.model_copy(update={"init_from": str(tmp_path / "wide.pt")})
    model = model_of(8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(InputError, match=r"^training.init file 'wide.pt'.*'1.weight' is \[16"):
        initial_weights(tcfg, model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_check_fits_passes_a_fitting_state_and_compares_a_meta_model():
    with torch.device("meta"):
        meta = model_of(8)
    check_fits(model_of(8).state_dict(), meta, "champion v1")  # no error
    with pytest.raises(InputError, match="it has 'extra' the model does not"):
        check_fits({**model_of(8).state_dict(), "extra": torch.zeros(1)}, meta, "champion v1")


# -- model files ---------------------------------------------------------------------------


def test_load_weights_reads_each_format_and_never_an_optimizer_state(tmp_path):
    state = model_of().state_dict()
    ckpt = checkpoint.save({"model": state, "optim": {"m": torch.ones(1)}, "step": 3}, tmp_path, 3)
    torch.save(state, tmp_path / "plain.pt")
    torch.save({"model": state}, tmp_path / "wrapped.pt")
    for path in (ckpt, tmp_path / "plain.pt", tmp_path / "wrapped.pt"):
        got = load_weights(path)
        assert set(got) == set(state) and all(torch.equal(got[k], state[k]) for k in state)


def test_a_registry_model_file_is_checked_against_its_sidecar(tmp_path):
    cfg = cfg_of(tmp_path)
    promoted(cfg)
    path = champion(cfg).path
    assert set(load_weights(path)) == set(model_of().state_dict())
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(InputError, match=r"^training.init: model.pt: checksum mismatch"):
        load_weights(path)


@pytest.mark.parametrize("kind", ["list", "empty", "code", "text"])
def test_a_file_that_holds_no_state_dict_is_refused_naming_training_init(tmp_path, kind):
    p = tmp_path / "bad.pt"
    if kind == "list":
        torch.save([torch.ones(1)], p)
    elif kind == "empty":
        torch.save({}, p)
    elif kind == "code":  # a pickle of an object: weights_only refuses it
        p.write_bytes(pickle.dumps(ConfigError("x"), protocol=2))
    else:
        p.write_text("not a model")
    with pytest.raises(InputError, match=r"^training.init: bad.pt"):
        load_weights(p)


# -- the conf rule and the trigger form ---------------------------------------------------


def test_a_runs_conf_may_choose_scratch_or_champion_or_the_files_own_never_a_path(tmp_path):
    cfg = cfg_of(tmp_path, "warm.pt")
    for ok in ("scratch", "champion", "warm.pt"):
        assert merge_conf(cfg, {"training": {"init": ok}}).training.init == ok
    with pytest.raises(ConfigError) as e:
        merge_conf(cfg, {"training": {"init": "/etc/other.pt"}}, "--set")
    said = str(e.value)
    assert said.startswith("--set: training.init '/etc/other.pt' names a file on the workers")
    assert "scratch or champion or the file's own ('warm.pt')" in said


def test_the_trigger_form_offers_scratch_champion_and_the_files_own():
    pytest.importorskip("airflow")
    cfg = load_config_text("training: {init: warm.pt}\n")
    schema = dag_params(cfg)["training"].schema
    assert schema["properties"]["init"]["enum"] == ["scratch", "champion", "warm.pt"]
    plain = dag_params(load_config_text(""))["training"].schema
    assert plain["properties"]["init"]["enum"] == ["scratch", "champion"]


def load_config_text(text: str):
    import yaml

    from dagtrain.config import validate

    return validate(yaml.safe_load("name: w\n" + text) or {"name": "w"})


def test_a_rounds_pipeline_refuses_a_warm_start_in_its_file_and_its_conf(tmp_path):
    with pytest.raises(ConfigError, match=r"training.init 'champion': a rounds pipeline"):
        cfg_of(tmp_path, "champion", extra="pipeline: rounds\n")
    rounds = cfg_of(tmp_path, "scratch", extra="pipeline: rounds\n")
    with pytest.raises(ConfigError, match=r"set training\.init: scratch"):
        merge_conf(rounds, {"training": {"init": "champion"}})


# -- lineage and what the run says ---------------------------------------------------------


def test_promote_records_where_the_runs_training_started(tmp_path):
    cfg = cfg_of(tmp_path)
    first, _ = promoted(cfg)
    run = ArtifactLayout.of(cfg).run("r2")
    run.train.dir.mkdir(parents=True, exist_ok=True)
    init = {"kind": "champion", "version": first, "path": champion(cfg).path, "note": None}
    run.train.result.write_text(json.dumps({"init": init}))
    ckpt = checkpoint.save({"model": model_of().state_dict()}, run.train.checkpoints, 5)
    entry = promote(cfg, str(ckpt), {"test_accuracy": 0.95, "test_loss": 0.2}, {"run_id": "r2"})
    assert entry["lineage"]["init"] == init and entry["lineage"]["run_id"] == "r2"
    reg = json.loads((cfg.artifact_root() / "registry" / "registry.json").read_text())
    assert reg["versions"][-1]["lineage"]["init"]["version"] == first
    assert init_said(init) == f"champion v{first}"


def test_the_closing_lines_say_a_warm_start_in_80_columns():
    path = "/a/very/long/folder/" + "x" * 60 + "/registry/models/v0003/model.pt"
    champ = {"kind": "champion", "version": 3, "path": path, "note": None}
    file_ = {"kind": "file", "version": None, "path": "/data/" + "m" * 70 + ".pt", "note": None}
    none_yet = {"kind": "scratch", "version": None, "path": None, "note": "no champion yet"}
    assert init_line({"init": champ}) == "started from champion v3 (training.init: champion)"
    assert init_line({"init": none_yet}) == (
        "training.init champion: no champion yet, trained from scratch"
    )
    assert init_line({"init": {"kind": "scratch"}}) is None and init_line(None) is None
    assert all(len(init_line({"init": i})) <= 80 for i in (champ, file_, none_yet))
    assert outcome_lines({"init": champ}, None, None)[0].startswith("started from champion v3")


def test_a_warm_started_pipeline_prepares_its_data(tmp_path):
    # the data-prep phase builds the ranks' config too: champion (no file yet) passes
    from dagtrain.phases.prep import prepare

    out = prepare(cfg_of(tmp_path, "champion"))
    assert out["version"] and (tmp_path / "art").is_dir()


def test_a_model_file_is_mapped_not_read_and_an_old_format_one_read(tmp_path):
    # mapped: its shapes are checked without its bytes, and a pipeline rank brings into
    # memory only the tensors it copies (Linux: the mapping is in /proc/self/maps)
    w = torch.randn(64, 32)
    new, old = tmp_path / "new.pt", tmp_path / "old.pt"
    torch.save({"w": w}, new)
    torch.save({"w": w}, old, _use_new_zipfile_serialization=False)  # not a zip
    state = load_weights(new)
    assert torch.equal(state["w"], w)
    assert str(new) in Path("/proc/self/maps").read_text()
    del state
    assert str(new) not in Path("/proc/self/maps").read_text()  # nothing else holds it
    assert torch.equal(load_weights(old)["w"], w)


def test_a_pipeline_rank_warm_starts_from_a_sharded_checkpoint_reading_its_stage_only(
    tmp_path, monkeypatch
):
    # a 2-stage checkpoint (each stage's tensors in a DCP folder); a stage-1 rank's
    # model holds stage 0's blocks on the meta device: it checks the whole model's
    # shapes (stage 0's from the folder's metadata) and reads its own tensors only
    state = model_of().state_dict()
    first = {k: v for k, v in state.items() if k.startswith("1.")}
    rest = {k: v for k, v in state.items() if k not in first}
    opt = [{"state": {}, "param_groups": [{"params": list(range(len(state)))}]}]
    shard = {"file": "ckpt-00000003.stage1.pt", "stage": 1, "keys": sorted(rest), "params": []}
    checkpoint.save({"model": rest, "optim": opt, "step": 3}, tmp_path, 3, stage=1)
    main = {"model": first, "optim": opt, "step": 3, "shards": [shard]}
    path = checkpoint.save(main, tmp_path, 3)
    read: list[list[str]] = []
    from dagtrain.training.rank import tensor_folder

    loads = tensor_folder.load_tensors

    def spy(folder, names):
        read.append(sorted(names))
        return loads(folder, names)

    monkeypatch.setattr(tensor_folder, "load_tensors", spy)
    model = model_of()
    model[1].to("meta")
    tcfg = TrainConfig(model={"name": "mlp", "args": {"hidden": [8]}}, training={"init": "x"})
    initial_weights(tcfg.model_copy(update={"init_from": str(path)}), model)
    assert read == [[f"model/{k}" for k in sorted(rest)]]  # stage 0's never read
    assert all(torch.equal(model.state_dict()[k], v) for k, v in rest.items())
