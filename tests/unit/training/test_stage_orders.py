"""Every order's graphs, played across the ranks of a pipeline without processes: each
rank runs its ready task of highest priority, a receive completes once its peer's send
has run, and each chunk's receives of one way complete in the order they were posted
(as their thread waits for them: transfers.py). Every task of every rank must run — an
order whose tokens or priorities could wedge the ranks fails here, not after a
collective timeout in a real job. And a V's sequence is torch's ZBV's."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from dagtrain.training.rank.split import Split
from dagtrain.training.rank.stage_graph import StageGraph, v_sequence

NAME = re.compile(r"([a-z-]+?)(\d+)(?:\.(\d+))?$")
BODIES = [
    "_load_next",
    "_zero_grads",
    "_recv_act",
    "_forward",
    "_send_act",
    "_recv_grad",
    "_backward",
    "_backward_input",
    "_backward_weight",
    "_send_grad",
    "_allreduce",
    "_check",
    "_update",
]


class _Rank(StageGraph):
    def __init__(self, split: Split, stage: int, M: int) -> None:
        self.split, self.stage, self.M = split, stage, M
        self.S, self.v, self.V, self.D = split.stages, split.chunks, len(split.ranges), 1
        self.parts, self.buckets = split.parts_of(stage), []
        for body in BODIES:
            setattr(self, body, lambda *a, **k: None)

    def remote(self, part: int, other: int) -> bool:
        return 0 <= other < self.V and self.split.stage_of(other) != self.stage


def play(order: str, S: int, M: int, v: int, placement: str) -> dict[int, list[str]]:
    """Each rank's tasks in the order they ran; AssertionError naming what is left if
    the ranks wedge."""
    split = Split(list(range(1, S * v)), S * v, "explicit", chunks=v, placement=placement)
    ranks = [_Rank(split, s, M) for s in range(S)]
    graphs = [r._build(order) for r in ranks]
    waiting = [{id(t): 0 for t in g.tasks} for g in graphs]
    for g, w in zip(graphs, waiting):
        for t in g.tasks:
            for succ in t:
                w[id(succ)] += 1
    done: list[set[int]] = [set() for _ in ranks]
    queues: list[dict[tuple[str, int], list]] = [{} for _ in ranks]
    sent: set[tuple[str, int, int]] = set()  # (act or grad, the part it goes into, m)
    ran: dict[int, list[str]] = {s: [] for s in range(S)}

    def finish(s: int, t) -> None:
        done[s].add(id(t))
        for succ in t:
            waiting[s][id(succ)] -= 1

    moved = True
    while moved:
        moved = False
        for s, (rank, g) in enumerate(zip(ranks, graphs)):
            for q in queues[s].values():  # receives complete in the order posted
                while q:
                    way, m, j = _parse(q[0].name)
                    if (way.removeprefix("recv-"), rank.parts[j], m) not in sent:
                        break
                    finish(s, q.pop(0))
                    moved = True
            posted = {id(t) for q in queues[s].values() for t in q}
            ready = [
                t
                for t in g.tasks
                if not waiting[s][id(t)] and id(t) not in done[s] and id(t) not in posted
            ]
            if not ready:
                continue
            t = max(ready, key=lambda t: (t.priority, -t.index))
            ran[s].append(t.name)
            moved = True
            if t.name.startswith("recv-"):
                way, m, j = _parse(t.name)
                queues[s].setdefault((way, j), []).append(t)
                continue
            if t.name.startswith("send-"):
                way, m, j = _parse(t.name)
                c = rank.parts[j]
                sent.add(("act", c + 1, m) if way == "send-act" else ("grad", c - 1, m))
            finish(s, t)
    for s, g in enumerate(graphs):
        left = [t.name for t in g.tasks if id(t) not in done[s]]
        assert not left, f"{order} S={S} M={M} v={v} {placement}: rank {s} wedged: {left[:8]}"
    return ran


def _parse(name: str) -> tuple[str, int, int]:
    got = NAME.match(name)
    assert got is not None, name
    return got.group(1), int(got.group(2)), int(got.group(3) or 0)


CASES = [
    (order, S, M, v, placement)
    for order in ("gpipe", "1f1b", "zero-bubble")
    for S in (2, 3, 4)
    for M in (1, 2, 4, 6, 8, 12)
    for v, placement in ((1, "looped"), (2, "looped"), (3, "looped"), (2, "v"))
    if order == "gpipe" or v == 1 or M % S == 0  # (the config's rule for interleaving)
]


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_every_order_runs_to_its_end_on_every_rank(case):
    order, S, M, v, placement = case
    ran = play(order, S, M, v, placement)
    # every forward and backward of every microbatch and chunk, once per rank
    for s, names in ran.items():
        fs = [n for n in names if n.startswith("F")]
        assert len(fs) == len(set(fs)) == M * v, (s, fs)


def test_a_vs_sequence_is_torchs_zbv():
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    for S, M in ((2, 4), (2, 1), (3, 6), (4, 8), (4, 5)):
        zbv = SimpleNamespace(pp_group_size=S, num_stages=2 * S, _n_microbatches=M)
        for s in range(S):
            actions = ScheduleZBVZeroBubble._calculate_single_rank_operations(zbv, s)
            theirs = [
                ("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index,
                 0 if a.stage_index == s else 1)
                for a in actions
                if a is not None and a.computation_type.name in ("FORWARD", "BACKWARD_INPUT")
            ]  # fmt: skip
            assert v_sequence(S, M, s) == theirs, (S, M, s)


def test_a_vs_ranks_hold_the_first_and_last_parts_and_turn_in_memory():
    split = Split([1, 2, 3, 4, 5], 6, "explicit", chunks=2, placement="v")
    assert [split.parts_of(s) for s in range(3)] == [[0, 5], [1, 4], [2, 3]]
    assert [split.stage_of(c) for c in range(6)] == [0, 1, 2, 2, 1, 0]
    assert split.label(4) == "stage 1 chunk 1"
    # the last rank's turn: no transfer between its parts 2 and 3
    ran = play("1f1b", 3, 3, 2, "v")
    assert not any(n.startswith(("send-act", "recv-grad")) and n.endswith(".0") for n in ran[2])
    assert not any(n.startswith(("recv-act", "send-grad")) and n.endswith(".1") for n in ran[2])
    assert any(n.startswith("send-act") and n.endswith(".1") for n in ran[2])
