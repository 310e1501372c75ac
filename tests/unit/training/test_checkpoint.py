"""Checkpoints: atomic, checksummed, last K kept, corrupt newest skipped."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path

import pytest
import torch

from dagtrain.training.rank import checkpoint


def state(v: float) -> dict:
    return {"w": torch.full((4,), v), "step": int(v), "meta": "x"}


def test_save_load_and_keep_the_last_k(tmp_path):
    for step in range(1, 6):
        checkpoint.save(state(step), tmp_path, step, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "ckpt-00000004.pt",
        "ckpt-00000004.pt.json",
        "ckpt-00000005.pt",
        "ckpt-00000005.pt.json",
    ]
    path, loaded = checkpoint.latest(tmp_path)
    assert path.name == "ckpt-00000005.pt" and torch.equal(loaded["w"], torch.full((4,), 5.0))


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-sidecar"])
def test_a_bad_newest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, damage):
    checkpoint.save(state(1), tmp_path, 1)
    newest = checkpoint.save(state(2), tmp_path, 2)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))
    else:
        newest.with_name(newest.name + ".json").unlink()
    with caplog.at_level(logging.WARNING):
        path, loaded = checkpoint.latest(tmp_path)
    assert path.name == "ckpt-00000001.pt" and loaded["step"] == 1
    assert "skipping checkpoint" in caplog.text and "ckpt-00000002.pt" in caplog.text


def test_no_checkpoint_is_none_and_no_temp_files_are_left(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    checkpoint.save(state(3), tmp_path, 3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_loading_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    checkpoint.save({"x": Evil()}, tmp_path, 1)
    with pytest.raises(Exception, match=r"[Ww]eights.only|Unsupported global"):
        checkpoint.load(tmp_path / "ckpt-00000001.pt")


def test_temp_files_of_a_killed_writer_are_cleared_by_the_next_save(tmp_path):
    (tmp_path / ".ckpt-00000002.pt.abc123").write_bytes(b"half a checkpoint")
    checkpoint.save(state(3), tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000003.pt",
        "ckpt-00000003.pt.json",
    ]


def sharded(tmp_path, step: int, v: float, write_shard: bool = True, keep: int = 3):
    """A 2-stage pipeline's checkpoint: stage 0's file (listing stage 1's) and the shard."""
    n = 2  # parameters: "a" (index 0, stage 0) and "b" (index 1, stage 1)
    groups = [{"lr": 0.1, "params": [0, 1]}]
    if write_shard:
        shard = {
            "model": {"b": torch.full((3,), v + 0.5)},
            "optim": [{"state": {1: {"m": torch.full((3,), -v)}}, "param_groups": groups}],
            "step": step,
        }
        checkpoint.save(shard, tmp_path, step, keep=keep, stage=1)
    main = {
        "model": {"a": torch.full((2,), v)},
        "optim": [{"state": {0: {"m": torch.full((2,), v)}}, "param_groups": groups}],
        "step": step,
        "shards": [
            {"file": f"ckpt-{step:08d}.stage1.pt", "stage": 1, "keys": ["b"], "params": [1]}
        ],
    }
    assert n == len(groups[0]["params"])
    return checkpoint.save(main, tmp_path, step, keep=keep)


def test_a_sharded_checkpoint_loads_whole_or_by_keys_and_needs_every_shard(tmp_path, caplog):
    sharded(tmp_path, 10, 1.0)
    path, whole = checkpoint.latest(tmp_path)
    assert path.name == "ckpt-00000010.pt" and "shards" not in whole
    assert whole["stages"] == 2  # how many stages wrote it (the resume's log says so)
    assert set(whole["model"]) == {"a", "b"} and torch.equal(
        whole["model"]["b"], torch.full((3,), 1.5)
    )
    assert set(whole["optim"][0]["state"]) == {0, 1}  # merged: one optimizer over both
    # a stage-1 rank reads its keys (and the shard holding them) only
    mine = checkpoint.load(path, {"b"})
    assert set(mine["model"]) == {"b"} and 1 in mine["optim"][0]["state"]
    # a newer checkpoint whose stage-1 shard was never written is not whole: skipped
    sharded(tmp_path, 20, 2.0, write_shard=False)
    with caplog.at_level(logging.WARNING):
        path, got = checkpoint.latest(tmp_path, {"a"})
    assert path.name == "ckpt-00000010.pt" and set(got["model"]) == {"a"}
    assert "ckpt-00000020.stage1.pt" in caplog.text
    # a corrupt shard too, though the reader does not need its keys
    sharded(tmp_path, 30, 3.0)
    shard = tmp_path / "ckpt-00000030.stage1.pt"
    shard.write_bytes(shard.read_bytes()[:-5])
    assert checkpoint.latest(tmp_path, {"a"})[0].name == "ckpt-00000010.pt"
    # and a whole shard of another split's run (an earlier try's, same step): foreign
    sharded(tmp_path, 40, 4.0, keep=5)
    other = {"model": {"c": torch.zeros(1)}, "optim": [{"state": {}}], "step": 40}
    checkpoint.save(other, tmp_path, 40, keep=5, stage=1)
    assert checkpoint.latest(tmp_path)[0].name == "ckpt-00000010.pt"


def test_a_stage_that_wants_none_of_the_checkpoints_own_file_maps_it_unread(tmp_path, monkeypatch):
    # stage 1 reads the checkpoint's own file (stage 0's) for the run's figures and its
    # list of shards only: mapped, its tensors dropped unread, nothing left mapped
    # (Linux: /proc/self/maps); stage 0 wants them: read, not mapped
    path = sharded(tmp_path, 10, 1.0)
    loads: list[tuple[str, bool]] = []
    real = checkpoint._torch_load

    def spy(p, f, mmap):
        loads.append((p.name, mmap))
        return real(p, f, mmap)

    monkeypatch.setattr(checkpoint, "_torch_load", spy)
    mine = checkpoint.load(path, {"b"})
    assert loads == [(path.name, True), ("ckpt-00000010.stage1.pt", False)]
    assert str(path) not in Path("/proc/self/maps").read_text()
    assert mine["step"] == 10 and torch.equal(mine["model"]["b"], torch.full((3,), 1.5))
    assert set(mine["optim"][0]["state"]) == {1}  # stage 0's entry dropped
    loads.clear()
    ours = checkpoint.load(path, {"a"})
    assert loads == [(path.name, True), (path.name, False)]  # wanted: read
    assert set(ours["model"]) == {"a"} and 0 in ours["optim"][0]["state"]
    # a file that cannot be mapped is read (a file system without mmap)
    loads.clear()

    def no_map(p, f, mmap):
        loads.append((p.name, mmap))
        if mmap:
            raise checkpoint.InputError("cannot map")
        return real(p, f, mmap)

    monkeypatch.setattr(checkpoint, "_torch_load", no_map)
    whole = checkpoint.load(path, mmap=True)
    assert set(whole["model"]) == {"a", "b"} and (path.name, False) in loads


def test_each_stage_keeps_its_last_k_and_clears_only_its_own_temp_files(tmp_path):
    (tmp_path / ".ckpt-00000005.stage1.pt.abc").write_bytes(b"stage 1 writing")
    (tmp_path / ".ckpt-00000005.pt.xyz").write_bytes(b"stage 0 killed")
    for step in (1, 2, 3):
        sharded(tmp_path, step, float(step), keep=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert ".ckpt-00000005.stage1.pt.abc" not in names  # stage 1's writer cleared its own
    # (keep 1 and a sharded checkpoint's margin: each stage keeps 3, each part with its
    # tensors' DCP folder)
    assert [n for n in names if not n.startswith(".")] == [
        "ckpt-00000001.pt", "ckpt-00000001.pt.json", "ckpt-00000001.stage0.dcp",
        "ckpt-00000001.stage1.dcp", "ckpt-00000001.stage1.pt", "ckpt-00000001.stage1.pt.json",
        "ckpt-00000002.pt", "ckpt-00000002.pt.json", "ckpt-00000002.stage0.dcp",
        "ckpt-00000002.stage1.dcp", "ckpt-00000002.stage1.pt", "ckpt-00000002.stage1.pt.json",
        "ckpt-00000003.pt", "ckpt-00000003.pt.json", "ckpt-00000003.stage0.dcp",
        "ckpt-00000003.stage1.dcp", "ckpt-00000003.stage1.pt", "ckpt-00000003.stage1.pt.json",
    ]  # fmt: skip
    (tmp_path / ".ckpt-00000009.stage1.pt.abc").write_bytes(b"stage 1 writing")
    # stage 0's writer of a 2-stage run leaves stage 1's alone
    sharded(tmp_path, 4, 4.0, write_shard=False, keep=1)
    assert (tmp_path / ".ckpt-00000009.stage1.pt.abc").exists()


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_sharded_checkpoint_keeps_two_more_files_of_each_stage(tmp_path, ahead):
    """The stages' writers run apart (each waits for its own previous write only): one
    may have finished checkpoint N while the other still writes N - 1, so with keep 1
    each stage keeps 3 files and checkpoint N - 2 is still whole."""
    for step in range(1, 6):
        sharded(tmp_path, step, float(step), keep=1)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == [
        "ckpt-00000003.pt", "ckpt-00000003.stage1.pt",
        "ckpt-00000004.pt", "ckpt-00000004.stage1.pt",
        "ckpt-00000005.pt", "ckpt-00000005.stage1.pt",
    ]  # fmt: skip
    assert len(list(tmp_path.glob("ckpt-*.pt.json"))) == 6  # each with its sidecar
    # the stage ahead writes 6 and 7 while the other's 6 is still being written
    for step in (6, 7):
        if ahead == 0:
            sharded(tmp_path, step, float(step), write_shard=False, keep=1)
        else:
            shard = {"model": {"b": torch.zeros(3)}, "optim": [{"state": {}}], "step": step}
            checkpoint.save(shard, tmp_path, step, keep=1, stage=1)
    found = checkpoint.latest(tmp_path)
    assert found is not None and found[0].name == "ckpt-00000005.pt"


def test_the_digest_combines_per_tensor_digests_so_stages_can_each_digest_their_own():
    a = {"x": torch.arange(3.0), "y": torch.ones(2)}
    whole = checkpoint.state_digest(a)
    parts = checkpoint.tensor_digests({"x": a["x"]}) | checkpoint.tensor_digests({"y": a["y"]})
    assert checkpoint.combine_digests(parts) == whole
    assert checkpoint.state_digest({"x": a["x"], "y": torch.zeros(2)}) != whole


def test_a_checkpoint_is_streamed_to_its_file_with_torch_saves_bytes(tmp_path):
    # written straight to the file and hashed on the way (never held whole in memory):
    # the bytes are torch.save's, the sidecar their size and sha256
    s = {"model": {"w": torch.randn(300, 7)}, "step": 3, "optim": [{"state": {}}]}
    path = checkpoint.save(s, tmp_path, 3)
    buf = io.BytesIO()
    torch.save(s, buf)
    assert path.read_bytes() == buf.getvalue()
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    assert meta["bytes"] == len(buf.getvalue())
    assert meta["sha256"] == hashlib.sha256(buf.getvalue()).hexdigest()
    assert not list(tmp_path.glob(".ckpt-*"))  # no temp file left
    assert torch.equal(checkpoint.load(path)["model"]["w"], s["model"]["w"])


def test_shards_of_stages_a_resumed_run_lacks_go_with_their_checkpoint(tmp_path):
    # a 2-stage run's checkpoints, then a run without a pipeline resumes from them (no
    # writer of stage 1 now): stage 1's shard goes once its checkpoint's own file is
    # rotated out, not before (the checkpoint is whole until then)
    for step in (1, 2, 3):
        sharded(tmp_path, step, float(step), keep=1)
    (tmp_path / ".ckpt-00000003.stage1.pt.abc").write_bytes(b"stage 1 killed writing")
    checkpoint.save(state(4), tmp_path, 4, keep=1)  # keeps 4 only: 1-3 rotated out...
    assert not (tmp_path / ".ckpt-00000003.stage1.pt.abc").exists()  # (and its temp)
    shards = sorted(p.name for p in tmp_path.glob("ckpt-*.stage*"))
    assert shards == []  # ...and their stage-1 shards with them, and the parts' tensors
    # a 2-stage run keeps its own stage 1's shards (their writer rotates them)
    for step in (5, 6):
        sharded(tmp_path, step, float(step), keep=1)
    assert (tmp_path / "ckpt-00000005.stage1.pt").exists()
    # a 1-stage checkpoint written while a 2-stage one's own file is kept: whole still
    checkpoint.save(state(7), tmp_path, 7, keep=3)
    assert checkpoint.load(tmp_path / "ckpt-00000006.pt")["model"]["b"].shape == (3,)


def test_a_pipeline_part_keeps_its_tensors_in_a_dcp_folder_that_torch_reads(tmp_path):
    # each part's tensors go through torch.distributed.checkpoint (no collectives:
    # no_dist), in DCP's own format; the part's file holds none, only their places,
    # and its sidecar the folder's files' checksums. torch's own tools read the folder.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = sharded(tmp_path, 10, 1.0)
    part = torch.load(tmp_path / "ckpt-00000010.stage1.pt", weights_only=True)
    assert part["model"] == {"b": "<dcp>"} and part["optim"][0]["state"] == {1: {"m": "<dcp>"}}
    folder = tmp_path / "ckpt-00000010.stage1.dcp"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [".metadata", "__0_0.distcp"]
    meta = json.loads((tmp_path / "ckpt-00000010.stage1.pt.json").read_text())
    for name in files:
        data = (folder / name).read_bytes()
        want = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        assert meta["tensors"][name] == want
    dcp_to_torch_save(folder, tmp_path / "stage1.pt")
    got = torch.load(tmp_path / "stage1.pt", weights_only=True)
    assert torch.equal(got["model/b"], torch.full((3,), 1.5))
    assert torch.equal(got["optim/0/1/m"], torch.full((3,), -1.0))
    whole = checkpoint.load(path)
    assert torch.equal(whole["optim"][0]["state"][1]["m"], torch.full((3,), -1.0))
    assert not list(tmp_path.glob(".ckpt-*"))  # no temp folder left


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "extra"])
def test_a_part_whose_tensors_are_damaged_is_not_whole(tmp_path, caplog, damage):
    sharded(tmp_path, 10, 1.0)
    sharded(tmp_path, 20, 2.0)
    folder = tmp_path / "ckpt-00000020.stage1.dcp"
    f = folder / "__0_0.distcp"
    data = f.read_bytes()
    if damage == "flip":
        f.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))
    elif damage == "truncate":
        f.write_bytes(data[:-4])
    elif damage == "missing":
        f.unlink()
    else:
        (folder / "__1_0.distcp").write_bytes(data)
    # stage 0 does not read stage 1's tensors, and still skips the checkpoint
    with caplog.at_level(logging.WARNING):
        path, got = checkpoint.latest(tmp_path, {"a"})
    assert path.name == "ckpt-00000010.pt" and torch.equal(got["model"]["a"], torch.ones(2))
    assert "ckpt-00000020.stage1.dcp" in caplog.text


def test_tied_views_and_other_values_come_back_as_saved_and_read_limits_the_read(tmp_path):
    w = torch.randn(100, 3)
    model = {"w": w, "tied": w, "v": w[:10], "x": torch.arange(5.0).to(torch.bfloat16)}
    part = {"model": model, "optim": [{"state": {0: {"step": torch.tensor(3.0), "k": 1}}}]}
    path = checkpoint.save({**part, "step": 1}, tmp_path, 1, stage=1)
    got = checkpoint.load(path)
    assert all(torch.equal(got["model"][k], v) for k, v in model.items())
    assert got["optim"][0]["state"][0] == {"step": torch.tensor(3.0), "k": 1}
    # read: only these of the model's tensors come into memory, the others as their
    # shapes and types (a warm start's check of the whole model); optim=False: none of
    # the optimizer's
    got = checkpoint.load(path, read={"w"}, optim=False)
    assert torch.equal(got["model"]["w"], w) and got["optim"][0]["state"] == {}
    assert got["model"]["x"].is_meta and got["model"]["x"].dtype == torch.bfloat16
    assert got["model"]["v"].shape == (10, 3)


def test_a_dcp_folder_whose_metadata_holds_other_objects_is_refused(tmp_path):
    # the metadata is a pickle: read with DCP's metadata types and nothing else
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    sharded(tmp_path, 10, 1.0)
    path = sharded(tmp_path, 20, 2.0)
    folder = tmp_path / "ckpt-00000020.stage0.dcp"
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    side = path.with_name(path.name + ".json")
    meta = json.loads(side.read_text())  # its checksum made to match: the reader refuses
    data = (folder / ".metadata").read_bytes()
    meta["tensors"][".metadata"] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    side.write_text(json.dumps(meta))
    with pytest.raises(checkpoint.InputError, match=r"builtins\.print"):
        checkpoint.load(path)
    assert checkpoint.latest(tmp_path)[0].name == "ckpt-00000010.pt"


def test_tensors_without_their_part_and_a_killed_writers_folder_are_cleared(tmp_path):
    sharded(tmp_path, 1, 1.0)
    # a writer killed after its tensors were in, before its part's file was
    orphan = tmp_path / "ckpt-00000002.stage1.dcp"
    orphan.mkdir()
    (orphan / "__0_0.distcp").write_bytes(b"x")
    temp = tmp_path / ".ckpt-00000002.stage1.dcp.abc"  # killed while writing them
    temp.mkdir()
    (temp / "__0_0.distcp").write_bytes(b"half")
    sharded(tmp_path, 3, 3.0)
    assert not orphan.exists() and not temp.exists()
    assert (tmp_path / "ckpt-00000001.stage1.dcp").is_dir()  # whole checkpoints' kept


def test_the_docs_dcp_example_reads_a_stages_tensors(tmp_path, monkeypatch):
    # docs/parallelism.md's example, run as written in a checkpoint folder
    import re

    doc = (Path(__file__).parents[3] / "docs/parallelism.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", doc, re.S | re.M)
    (block,) = [b for b in blocks if "dcp_to_torch_save" in b]
    sharded(tmp_path, 120, 1.0)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(block, "docs/parallelism.md", "exec"), ns)
    assert torch.equal(ns["state"]["model/b"], torch.full((3,), 1.5))


def test_optim_false_reads_no_shards_optimizer_state(tmp_path, monkeypatch):
    # a consumer of the model alone (evaluation, promotion, a warm start's check)
    from dagtrain.training.rank import tensor_folder

    path = sharded(tmp_path, 10, 1.0)
    read: list[str] = []
    loads = tensor_folder.load_tensors

    def spy(folder, names):
        read.extend(names)
        return loads(folder, names)

    monkeypatch.setattr(tensor_folder, "load_tensors", spy)
    got = checkpoint.load(path, mmap=True, optim=False)
    assert sorted(read) == ["model/a", "model/b"]  # every stage's, no optimizer state
    assert got["optim"][0]["state"] == {} and torch.equal(got["model"]["b"], torch.full((3,), 1.5))


def test_a_folder_dcp_cannot_read_is_skipped_like_a_corrupt_checkpoint(tmp_path, caplog):
    # checksums that match bytes DCP cannot read (DCP raises CheckpointException, a
    # BaseException): an InputError, and the previous checkpoint is used
    sharded(tmp_path, 10, 1.0)
    path = sharded(tmp_path, 20, 2.0)
    folder = tmp_path / "ckpt-00000020.stage1.dcp"
    data = b"not a torch.save record" * 10
    (folder / "__0_0.distcp").write_bytes(data)
    side = tmp_path / "ckpt-00000020.stage1.pt.json"
    meta = json.loads(side.read_text())
    digest = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    meta["tensors"]["__0_0.distcp"] = digest
    side.write_text(json.dumps(meta))
    with pytest.raises(checkpoint.InputError, match=r"ckpt-00000020\.stage1\.dcp: cannot be read"):
        checkpoint.load(path)
    with caplog.at_level(logging.WARNING):
        assert checkpoint.latest(tmp_path)[0].name == "ckpt-00000010.pt"
