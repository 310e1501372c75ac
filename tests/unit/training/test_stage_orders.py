"""Every order's graphs, played across the ranks of a pipeline without processes: each
rank runs its ready task of highest priority, a receive completes once its peer's send
has run, and each chunk's receives of one way complete in the order they were posted
(as their thread waits for them: transfers.py), in lockstep and in timings drawn at
random (compute 1-6 ticks, a transfer 0-4). Every task of every rank must run: an order
whose tokens or priorities wedge the ranks in one of these timings fails here, not
after a collective timeout in a real job (no play proves it for every timing). And a
V's sequence is torch's ZBV's."""

from __future__ import annotations

import random
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


def play(
    order: str, S: int, M: int, v: int, placement: str, seed: int | None = None
) -> dict[int, list[str]]:
    """Each rank's tasks in the order they ran; AssertionError naming what is left if
    the ranks wedge. With ``seed``, a timing drawn from it: each compute task takes 1-6
    ticks, a transfer arrives 0-4 ticks after its send, and the ranks take their turns
    in a random order each tick; without, every task one tick and no delay."""
    rng = random.Random(seed)
    split = Split(list(range(1, S * v)), S * v, "explicit", chunks=v, placement=placement)
    ranks = [_Rank(split, s, M) for s in range(S)]
    graphs = [r._build(order) for r in ranks]
    for g in graphs:
        g.prepare()  # (resolves the names in ``after``)
    waiting = [{id(t): 0 for t in g.tasks} for g in graphs]
    for g, w in zip(graphs, waiting):
        for t in g.tasks:
            for succ in t:
                w[id(succ)] += 1
    ready = [{id(t): t for t in g.tasks if not w[id(t)]} for g, w in zip(graphs, waiting)]
    done: list[set[int]] = [set() for _ in ranks]
    queues: list[dict[tuple[str, int], list]] = [{} for _ in ranks]
    arrives: dict[tuple[str, int, int], int] = {}  # (act or grad, part into, m) -> tick
    running: list[tuple[int, object] | None] = [None] * S
    ran: dict[int, list[str]] = {s: [] for s in range(S)}

    def finish(s: int, t) -> None:
        done[s].add(id(t))
        for succ in t:
            waiting[s][id(succ)] -= 1
            if not waiting[s][id(succ)]:
                ready[s][id(succ)] = succ

    def end(s: int, t, tick: int) -> None:  # a task's body is over
        if t.name.startswith("recv-"):  # posted: completes once its transfer is in
            way, m, j = _parse(t.name)
            queues[s].setdefault((way, j), []).append(t)
            return
        if t.name.startswith("send-"):
            way, m, j = _parse(t.name)
            c = ranks[s].parts[j]
            key = ("act", c + 1, m) if way == "send-act" else ("grad", c - 1, m)
            arrives[key] = tick + (rng.randint(0, 4) if seed is not None else 0)
        finish(s, t)

    def arrived(s: int, tick: int) -> bool:  # receives complete in the order posted
        got = False
        for q in queues[s].values():
            while q:
                way, m, j = _parse(q[0].name)
                at = arrives.get((way.removeprefix("recv-"), ranks[s].parts[j], m))
                if at is None or at > tick:
                    break
                finish(s, q.pop(0))
                got = True
        return got

    def start(s: int):  # the ready task of highest priority
        t = max(ready[s].values(), key=lambda t: (t.priority, -t.index))
        del ready[s][id(t)]
        ran[s].append(t.name)
        return t

    tick = 0
    while True:
        moved = False
        if seed is None:  # lockstep: rank by rank, each task's effects seen at once
            for s in range(S):
                moved |= arrived(s, tick)
                if ready[s]:
                    end(s, start(s), tick)
                    moved = True
            if not moved:
                break
            continue
        for s in range(S):  # the tasks that end now; a send's transfer leaves
            if running[s] is not None and running[s][0] <= tick:
                end(s, running[s][1], tick)
                running[s] = None
                moved = True
        for s in range(S):
            moved |= arrived(s, tick)
        turns = list(range(S))
        rng.shuffle(turns)
        for s in turns:  # each idle rank starts a task: compute 1-6 ticks, others 1
            if running[s] is None and ready[s]:
                t = start(s)
                running[s] = (tick + (rng.randint(1, 6) if t.name[0] in "FBW" else 1), t)
                moved = True
        if (
            not moved
            and all(r is None for r in running)
            and not any(a > tick for a in arrives.values())
        ):
            break
        tick += 1
    for s, g in enumerate(graphs):
        left = [t.name for t in g.tasks if id(t) not in done[s]]
        assert not left, (
            f"{order} S={S} M={M} v={v} {placement} seed={seed}: rank {s} wedged: {left[:8]}"
        )
    return ran


def _parse(name: str) -> tuple[str, int, int]:
    got = NAME.match(name)
    assert got is not None, name
    return got.group(1), int(got.group(2)), int(got.group(3) or 0)


CASES = [
    (order, S, M, v, placement)
    for order in ("gpipe", "1f1b", "zero-bubble")
    for S in (2, 3, 4)
    for M in (1, 2, 3, 4, 6, 8, 12)
    for v, placement in ((1, "looped"), (2, "looped"), (3, "looped"), (2, "v"))
    # (the config's rule for looped interleaving: microbatches in groups of S)
    if order == "gpipe" or v == 1 or placement == "v" or M % S == 0
]


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_every_order_runs_to_its_end_on_every_rank(case):
    order, S, M, v, placement = case
    for seed in (None, 0, 1, 2):  # lockstep, then three timings drawn at random
        ran = play(order, S, M, v, placement, seed)
        # every forward of every microbatch and chunk, once per rank
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
            assert list(v_sequence(S, M, s)) == theirs, (S, M, s)


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


def _weights(order: str, S: int, M: int, v: int, placement: str) -> list[set[tuple[int, int]]]:
    """Each rank's (microbatch, chunk) whose backward its graph splits (has a W)."""
    split = Split(list(range(1, S * v)), S * v, "explicit", chunks=v, placement=placement)
    got = []
    for s in range(S):
        names = [t.name for t in _Rank(split, s, M)._build(order).tasks]
        ws = [re.match(r"W(\d+)(?:\.(\d+))?$", n) for n in names]
        got.append({(int(w.group(1)), int(w.group(2) or 0)) for w in ws if w})
    return got


def test_zero_bubble_splits_the_backwards_after_a_ranks_last_forward():
    # 1F1B's sequence: stage s runs its last S - s backwards after its last forward;
    # the first part's backward is never split (no input gradient to send first)
    assert _weights("zero-bubble", 2, 4, 1, "looped") == [set(), {(3, 0)}]
    assert _weights("zero-bubble", 4, 8, 1, "looped") == [
        set(), {(5, 0), (6, 0), (7, 0)}, {(6, 0), (7, 0)}, {(7, 0)}
    ]  # fmt: skip
    # a V of 2 (rank 0: parts 0 and 3, rank 1: parts 1 and 2): what follows the last
    # forward in ZBV's sequence
    assert _weights("zero-bubble", 2, 4, 2, "v") == [
        {(3, 1)}, {(2, 0), (2, 1), (3, 0), (3, 1)}
    ]  # fmt: skip
    # interleaved (looped, 2 chunks; rank 0: parts 0 and 2, rank 1: parts 1 and 3):
    # Megatron-LM's last backwards (rank 1: its last T = 3), part 0's never
    assert _weights("zero-bubble", 2, 4, 2, "looped") == [
        {(2, 1), (3, 1)}, {(3, 1), (2, 0), (3, 0)}
    ]  # fmt: skip
    assert not _weights("1f1b", 2, 4, 1, "looped")[1]  # (1f1b splits none)


def _before(order: str, S: int, M: int, stage: int, early: bool = True) -> dict[str, set[str]]:
    """Each task of stage ``stage``'s graph: the names of the tasks it follows."""
    split = Split(list(range(1, S)), S, "explicit")
    rank = _Rank(split, stage, M)
    rank.early_receives = early
    g = rank._build(order)
    g.prepare()
    before: dict[str, set[str]] = {t.name: set() for t in g.tasks}
    for t in g.tasks:
        for succ in t:
            before[succ.name].add(t.name)
    return before


def test_a_receive_is_posted_one_forward_before_its_forward_may_run():
    # the last of 2 stages under 1f1b (T = 1): F{m} after B{m-1}, its receive after
    # B{m-2} (and after the chunk's previous receive: posted in order)
    got = _before("1f1b", 2, 4, 1)
    assert {"B1"} <= got["F2"] and "B0" not in got["F2"] and "B1" not in got["recv-act2"]
    assert "B0" in got["recv-act2"] and not {"B0", "B1"} & got["recv-act1"]
    assert {"B1"} <= got["recv-act3"] and "B2" not in got["recv-act3"]
    # on NCCL (its transfers between two ranks queue on one stream) the forward's token
    nccl = _before("1f1b", 2, 4, 1, early=False)
    assert "B2" in nccl["recv-act3"] and "B1" in nccl["recv-act2"]
