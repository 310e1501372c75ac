"""RoundAveragingOperator: all shards checked before anything is read or written."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dagtrain.config import load_config
from dagtrain.operators import DataPrepOperator, RoundAveragingOperator
from dagtrain.operators._base import BadInput
from dagtrain.phases.rounds import ShardError, global_model, write_delta
from dagtrain.records.layout import ArtifactLayout

RUN = "manual__test"


@pytest.fixture
def setup(tmp_path):
    cfg_path = tmp_path / "rounds.yaml"
    cfg_path.write_text(
        "name: r\npipeline: rounds\nmodel: {name: mlp, args: {hidden: [8]}}\n"
        "rounds: {rounds: 2, shards: 3, outer_lr: 0.5, outer_momentum: 0.9}\n"
        "artifacts: {root: art}\n"
    )
    ctx = {"run_id": RUN, "dag_run": SimpleNamespace(conf={}), "ti": None, "outlet_events": {}}
    data = DataPrepOperator(task_id="prep", config=cfg_path, for_rounds=True).execute(ctx)
    cfg = load_config(cfg_path)
    manifest = json.loads(open(data["manifest"]).read())
    manifest["dir"] = data["dir"]
    run = ArtifactLayout.of(cfg).run(RUN)
    base, _, _ = global_model(cfg, manifest, run, 0)
    torch.manual_seed(1)
    locals_ = []
    for k in range(3):
        local = {n: v - 0.01 * (k + 1) * torch.ones_like(v) for n, v in base.items()}
        write_delta(run.shard(0, k), k, base, local)
        locals_.append(local)
    op = RoundAveragingOperator(task_id="sync", config=cfg_path, data=data, round=0)
    return SimpleNamespace(op=op, ctx=ctx, run=run, base=base, cfg=cfg, locals=locals_)


def test_good_shards_are_averaged_with_an_outer_nesterov_step(setup):
    s = setup
    out = s.op.execute(s.ctx)
    snap = torch.load(out["checkpoint"], weights_only=True)
    # mean delta = 0.02 everywhere; v = 0.02; w - 0.5 * (0.02 + 0.9 * 0.02)
    for n, w in s.base.items():
        assert torch.allclose(snap["model"][n], w - 0.5 * 0.038, atol=1e-6), n
        assert torch.allclose(snap["momentum"][n], torch.full_like(w, 0.02))
    assert snap["round"] == 1


def _damage(path, how):
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("how", ["missing", "truncated", "misshaped", "nonfinite"])
def test_a_bad_shard_fails_naming_it_and_nothing_is_written(setup, how):
    s = setup
    shard = s.run.shard(0, 1)
    if how in ("missing", "truncated"):
        _damage(shard.delta, how)
    else:
        local = dict(s.locals[1])
        name = next(iter(local))
        if how == "misshaped":
            bad_base = {**s.base, name: torch.zeros(3, 3)}
            local[name] = torch.zeros(3, 3)
            write_delta(shard, 1, bad_base, local)
            # keep the base digest honest so only the shape is wrong
            meta = json.loads(shard.delta_sidecar.read_text())
            good = json.loads((s.run.dir / "rounds/round-00/shard-00/delta.pt.json").read_text())
            meta["base_sha256"] = good["base_sha256"]
            shard.delta_sidecar.write_text(json.dumps(meta))
        else:
            local[name] = local[name].clone()
            local[name].view(-1)[0] = float("nan")
            write_delta(shard, 1, s.base, local)
    with pytest.raises(BadInput) as info:  # a ValueError that Airflow does not retry
        s.op.execute(s.ctx)
    assert isinstance(info.value.__cause__, ShardError)
    assert isinstance(info.value, ValueError)
    assert info.value.shard == 1
    assert str(info.value).startswith("shard 1:"), str(info.value)
    why = {
        "missing": "no contribution",
        "truncated": "checksum",
        "misshaped": "shape",
        "nonfinite": "non-finite",
    }[how]
    assert why in str(info.value), str(info.value)
    assert not s.run.globals.exists() or not any(s.run.globals.iterdir())


def test_a_shard_trained_from_another_global_model_is_refused(setup):
    s = setup
    other = {n: v + 1 for n, v in s.base.items()}
    write_delta(s.run.shard(0, 2), 2, other, s.locals[2])
    with pytest.raises(BadInput, match=r"shard 2: .*different global model"):
        s.op.execute(s.ctx)


def test_contributions_can_be_given_and_a_missing_one_is_named(setup):
    s = setup
    rd = s.run.dir / "rounds" / "round-00"
    given = [{"shard": k, "dir": str(rd / f"shard-{k:02d}")} for k in (0, 2)]
    s.op.contributions = given  # shard 1's output is absent
    with pytest.raises(BadInput, match=r"^shard 1: no contribution"):
        s.op.execute(s.ctx)
    s.op.contributions = [*given, {"shard": 1, "dir": str(rd / "shard-01")}]
    assert s.op.execute(s.ctx)["checkpoint"].endswith("ckpt-00000001.pt")


def test_a_round_records_its_global_model_and_the_page_shows_it_per_shard(setup):
    from dagtrain.plugins import report

    s = setup
    out = s.op.execute(s.ctx)
    assert 0 <= out["metrics"]["val_accuracy"] <= 1 and out["metrics"]["val_samples"] > 0
    doc = json.loads((s.run.dir / "rounds/round-00/global.json").read_text())
    assert doc["metrics"] == out["metrics"]
    stages = [
        {"task_id": "round_0_train", "map_index": k, "state": "success"} for k in range(3)
    ] + [{"task_id": "round_0_sync", "map_index": -1, "state": "success"}]
    root = s.cfg.artifact_root()
    rounds = report.run_report(root, s.cfg.dag_id, RUN, stages, None, None)["rounds"]
    assert [r["round"] for r in rounds] == [0]
    assert [(x["shard"], x["state"], x["contributed"]) for x in rounds[0]["shards"]] == [
        (k, "success", True) for k in range(3)
    ]
    assert rounds[0]["sync_state"] == "success" and rounds[0]["global"]["metrics"] == out["metrics"]


def test_contributions_naming_another_shards_folder_are_refused(setup):
    """The shards' XComs name their folders; a rewritten one (shard 1 pointing at shard
    0's folder, counting it twice) is refused by name before anything is averaged."""
    s = setup
    forged = [{"shard": k, "dir": str(s.run.shard(0, 0).dir)} for k in range(3)]
    op = RoundAveragingOperator(
        task_id="sync", config=s.op.config_path, data=s.op.data, round=0, contributions=forged
    )
    with pytest.raises(BadInput, match="shard 1 of round 0 names 'shard-00', not its own"):
        op.execute(s.ctx)
    assert not list(s.run.dir.rglob("global.json"))
    honest = [{"shard": k, "dir": str(s.run.shard(0, k).dir)} for k in range(3)]
    op = RoundAveragingOperator(
        task_id="sync", config=s.op.config_path, data=s.op.data, round=0, contributions=honest
    )
    assert op.execute(s.ctx)["shards"] == 3
