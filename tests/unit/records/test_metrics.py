"""A training task's metrics file: the lines its writers append, read back whole, one
row per epoch (the newest try's), and the one rule that groups the lines into tries."""

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


def _told(lines: list[dict]) -> list[tuple]:
    """What each line means for the tries, fed one at a time as a live follower would."""
    tries = metrics.Tries()
    out = []
    for m in lines:
        got = tries.feed(m)
        if got is not None:
            out.append((got.what, got.number, got.resumed_from_step, got.epochs_done_before))
    return out


def test_a_tries_first_start_says_where_it_began_and_its_later_ones_are_relaunches():
    start = {"kind": "start", "step": 0, "total_steps": 96, "steps_per_epoch": 48}
    lines = [
        {"kind": "try", "try": 1},
        {**start, "resumed_from_step": None},
        {"kind": "epoch", "epoch": 0, "step": 48},
        {"kind": "world", "change": "shrink", "from": 3, "to": 2},
        {**start, "step": 57, "resumed_from_step": 57},  # the elastic relaunch
        {"kind": "try", "try": 2},
        {**start, "step": 96, "resumed_from_step": 96},  # try 2 resumed
        {"kind": "world", "change": "grow", "from": 2, "to": 3},
        {"kind": "end", "step": 96},
    ]
    E = metrics.TryEvent
    assert _told(lines) == [
        (E.TRY, 1, None, None),
        (E.START, 1, None, 0),
        (E.WORLD, 1, None, None),
        (E.RELAUNCH, 1, None, None),
        (E.TRY, 2, None, None),
        (E.START, 2, 96, 2),
        (E.WORLD, 2, None, None),
    ]


def test_a_file_without_try_lines_numbers_its_starts_as_tries_of_their_own():
    start = {"kind": "start", "step": 0, "steps_per_epoch": 20, "resumed_from_step": None}
    lines = [
        start,
        {"kind": "epoch", "epoch": 0, "step": 20},
        {**start, "step": 20, "resumed_from_step": 20},  # not a relaunch: try 2
        {"kind": "world", "change": "shrink"},  # the newest try's
        {"kind": "try", "try": "3"},  # not a whole number: no try
    ]
    E = metrics.TryEvent
    assert _told(lines) == [(E.START, 1, None, 0), (E.START, 2, 20, 1), (E.WORLD, 2, None, None)]
    # a world line before any try: try 1's, and the start after it begins try 2
    told = _told([{"kind": "world"}, {"kind": "start", "resumed_from_step": 5}])
    assert told == [(E.WORLD, 1, None, None), (E.START, 2, 5, None)]
