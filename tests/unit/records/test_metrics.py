"""A training task's metrics file: the lines its writers append, read back whole, and
one row per epoch (the newest try's)."""

from __future__ import annotations

import json

from dagtrain.records import metrics
from dagtrain.records.metrics import Kind, WorldChange


def test_epoch_rows_keep_the_newest_try_of_each_epoch(tmp_path):
    f = tmp_path / "metrics.jsonl"
    lines = [
        {"kind": "try", "try": 1},
        {"kind": "epoch", "epoch": 0, "step": 20, "train_loss": 1.0},
        {"kind": "epoch", "epoch": 1, "step": 40, "train_loss": 0.9},
        {"kind": "try", "try": 2},
        {"kind": "epoch", "epoch": 1, "step": 40, "train_loss": 0.8},
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + "{half a line")
    rows = metrics.epochs(metrics.read(f))
    assert [(r["epoch"], r["train_loss"]) for r in rows] == [(0, 1.0), (1, 0.8)]
    assert all("kind" not in r for r in rows)


def test_what_the_writers_append_reads_back_in_order(tmp_path):
    f = tmp_path / "train" / "metrics.jsonl"  # its folder is made
    metrics.append(f, metrics.try_line(2))
    metrics.append(f, metrics.start_line(0, 40, 20, None))
    metrics.append(f, metrics.epoch_line({"epoch": 0, "train_loss": 0.5}, 20, 40, 900.0, 1.5))
    change = WorldChange("shrink", 3, 2, "rank 1 was killed", 12.0, ranks=[1], reached=7)
    metrics.append(f, change.public())
    metrics.append(f, metrics.end_line(40, 40))
    got = metrics.read(f)
    assert [m["kind"] for m in got] == [Kind.TRY, Kind.START, Kind.EPOCH, Kind.WORLD, Kind.END]
    assert all(isinstance(m["time"], float) for m in got)
    assert got[0]["try"] == 2 and got[1]["steps_per_epoch"] == 20
    assert got[2]["train_loss"] == 0.5 and got[2]["samples_per_second"] == 900.0
    world = got[3]
    assert (world["from"], world["to"], world["ranks"], world["step"]) == (3, 2, [1], None)
    assert "reached" not in world and "told" not in world and "from_" not in world
