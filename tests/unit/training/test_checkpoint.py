"""Checkpoints: atomic, checksummed, last K kept, corrupt newest skipped."""

from __future__ import annotations

import logging

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
