"""A pipeline stage's step as one TaskGraph per order: the tasks of each microbatch
and chunk (docs in :mod:`.pipelining`, whose :class:`~.pipelining.StageStep` runs
them), their priorities (each order's sequence) and the token (how many forwards may
be alive). The task bodies are the step's."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from dagtrain.records.trace import Op
from dagtrain.taskgraph import Event, Ref, TaskGraph

# the orders that split a backward into two tasks, B (the input gradient) and W (the
# weights'), where a bubble follows it: the backwards after a rank's last forward
_SPLIT_ORDERS = ("zero-bubble",)


class StageGraph:
    """The graph side of :class:`~.pipelining.StageStep` (its base): ``_build(order)``
    from the stage's shape (``M`` microbatches, ``S`` stages, ``v`` chunks of ``V``
    parts, ``D`` replicas) and the step's task methods."""

    M: int
    S: int
    v: int
    V: int
    D: int
    stage: int
    parts: list[int]
    buckets: list[Any]
    split: Any  # (.split.Split)
    # a receive goes one place before its forward's token (False on NCCL)
    early_receives = True

    def remote(self, part: int, other: int) -> bool:
        raise NotImplementedError  # (the step's)

    def _name(self, op: Op, m: int, j: int) -> str:
        return op(m, j if self.v > 1 else None)

    def _keys(self, order: str) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
        """The place of microbatch m's forward and backward through chunk j in the
        order's sequence of this rank's forwards and of its backwards."""
        M, S, v = self.M, self.S, self.v
        if order == "gpipe":  # (looped BFS with chunks: chunk by chunk, every microbatch)
            return (lambda m, j: j * M + m), (lambda m, j: (v - 1 - j) * M + m)
        if self.split.placement == "v":  # ZBV's sequence (v_sequence)
            seq = v_sequence(S, M, self.stage)
            fs = {q: i for i, q in enumerate((m, j) for op, m, j in seq if op == "F")}
            bs = {q: i for i, q in enumerate((m, j) for op, m, j in seq if op == "B")}
            return (lambda m, j: fs[m, j]), (lambda m, j: bs[m, j])
        # 1F1B, interleaved with chunks: microbatches in groups of S, each group through
        # chunk 0, then chunk 1, ...; backwards the other way round (Megatron-LM's)
        return (
            lambda m, j: (m // S) * S * v + j * S + m % S,
            lambda m, j: (m // S) * S * v + (v - 1 - j) * S + m % S,
        )

    def _alive(self, order: str) -> int:
        """T: how many of this rank's forwards may be alive (not yet freed)."""
        n, s = self.M * self.v, self.stage
        if order == "gpipe":
            return n
        if self.v == 1:
            return max(1, min(n, self.S - s))
        if self.split.placement == "v":  # the most alive at once in ZBV's sequence
            live = most = 0
            for op, *_ in v_sequence(self.S, self.M, s):
                live += 1 if op == "F" else -1
                most = max(most, live)
            return most
        # interleaved 1F1B's warm-up (Megatron-LM's), and the forward it overlaps
        return min(n, 2 * (self.S - s - 1) + (self.v - 1) * self.S + 1)

    def _cooldown(self, order: str) -> set[tuple[int, int]]:
        """The (microbatch, chunk) of the backwards after this rank's last forward in
        the order's sequence: where the stages after it still run theirs."""
        if self.split.placement == "v":
            seq = v_sequence(self.S, self.M, self.stage)
            last = max(i for i, (op, _, _) in enumerate(seq) if op == "F")
            return {(m, j) for op, m, j in seq[last + 1 :]}
        _, bkey = self._keys(order)
        n, alive = self.M * self.v, self._alive(order)
        return {(m, j) for m in range(self.M) for j in range(self.v) if bkey(m, j) >= n - alive}

    def _build(self, order: str) -> TaskGraph:
        g = TaskGraph(f"pipeline-stage{self.stage}-{order}")
        M, v = self.M, self.v
        n = M * v
        fkey, bkey = self._keys(order)
        alive = self._alive(order)
        back_first = order != "gpipe"
        pc = 5 * n  # transfers (and zero-grads) before any compute, W after all of it
        # each F's and B's priority: (op, microbatch, chunk) -> priority
        prio: dict[tuple[str, int, int], int] = {}
        if back_first and self.split.placement == "v":
            # a V: ZBV's sequence as the priorities of F and B alike
            seq = v_sequence(self.S, M, self.stage)
            prio = {(op, m, j): 4 * n - i for i, (op, m, j) in enumerate(seq)}
        elif back_first and v > 1:
            # interleaved: Megatron-LM's sequence as the priorities of F and B alike —
            # the warm-up's forwards, then a forward and a backward in turn (the
            # forward first: a later chunk's forward feeds the next stage, which
            # waits for it), then the last backwards; a task that is not ready yet is
            # passed by the next one that is
            fs = sorted(((m, j) for m in range(M) for j in range(v)), key=lambda q: fkey(*q))
            bs = sorted(((m, j) for m in range(M) for j in range(v)), key=lambda q: bkey(*q))
            w = alive - 1
            seq = [("F", q) for q in fs[:w]]
            for i in range(n - w):
                seq += [("F", fs[w + i]), ("B", bs[i])]
            seq += [("B", q) for q in bs[n - w :]]
            prio = {(op, *q): 4 * n - i for i, (op, q) in enumerate(seq)}
        else:  # each microbatch's B before the next F (gpipe: every F first)
            pf, pb = (2 * n, 3 * n) if back_first else (3 * n, 2 * n)
            for m in range(M):
                for j in range(v):
                    prio["F", m, j], prio["B", m, j] = pf - fkey(m, j), pb - bkey(m, j)

        # the backward of each place in the sequence, and the task that frees its
        # microbatch's activations (where the order splits that backward: W; never the
        # first part's, which has no input gradient to send first)
        cool = self._cooldown(order) if order in _SPLIT_ORDERS else set()
        parts = self.parts
        split = {(m, j): c > 0 and (m, j) in cool for m in range(M) for j, c in enumerate(parts)}
        frees = {}
        for m in range(M):
            for j in range(v):
                frees[bkey(m, j)] = self._name(Op.WEIGHT if split[m, j] else Op.BACKWARD, m, j)
        name = self._name
        # the chunk of this rank that runs each part (a V's turn: two of its chunks
        # next to each other, the activation and its gradient handed over in memory)
        local = {c: j for j, c in enumerate(self.parts)}
        g.add(self._load_next, name="load-next", out="next-batch")
        # while the stage waits for its first input, not before the step
        g.add(
            self._zero_grads, name="zero-grads", out=[f"grads{j}" for j in range(v)],
            priority=pc,
        )  # fmt: skip
        # the freeing task at each place of the backward sequence, and its chunk; and
        # per chunk, what its last receive waited for (the latest freeing task of each
        # chunk: a chunk's freeing tasks end in order, chained on its gradients), so
        # that a chunk's receives are posted in order
        chunk_at = {bkey(m, j): j for m in range(M) for j in range(v)}
        posted: dict[int, dict[int, int]] = {}
        for m in range(M):
            for j, c in enumerate(self.parts):
                k = fkey(m, j)
                token = (frees[k - alive],) if k >= alive else ()
                # its receive one place earlier, before the peer's send (not on NCCL,
                # whose transfers between two ranks queue on one stream: its receives
                # keep the forward's token, as before)
                waits = dict(posted.get(j, {}))
                if k > alive:  # the place T + 1 before this forward's
                    at = k - alive - 1
                    waits[chunk_at[at]] = max(at, waits.get(chunk_at[at], -1))
                posted[j] = waits
                early = tuple(frees[at] for at in sorted(waits.values()))
                if not self.early_receives:
                    early = token
                if c > 0 and not self.remote(c, c - 1):
                    inp: Any = Ref(f"act{m}.{local[c - 1]}")
                elif c > 0:
                    inp = Ref(f"in{m}.{j}")
                    ev = Event()
                    g.add(
                        self._recv_act, m, j, ev, name=name(Op.RECV_ACT, m, j),
                        out=f"in{m}.{j}", detach=ev, after=early, priority=pc - k,
                    )  # fmt: skip
                else:
                    inp = None
                g.add(
                    self._forward, m, j, inp,
                    name=name(Op.FORWARD, m, j), out=f"act{m}.{j}", in_="params",
                    after=token, priority=prio["F", m, j],
                )  # fmt: skip
                if self.remote(c, c + 1):
                    ev = Event()
                    g.add(
                        self._send_act, m, j, Ref(f"act{m}.{j}"), ev,
                        name=name(Op.SEND_ACT, m, j), detach=ev, priority=pc - k,
                    )  # fmt: skip
                    ev = Event()
                    g.add(
                        self._recv_grad, m, j, ev, name=name(Op.RECV_GRAD, m, j),
                        out=f"dout{m}.{j}", detach=ev, after=name(Op.FORWARD, m, j),
                        priority=pc - bkey(m, j),
                    )  # fmt: skip
        # a part's backward after the next part's where that is this rank's (it reads
        # that one's input gradient)
        turn = any(not self.remote(c, c + 1) for c in self.parts if c < self.V - 1)
        chunks = sorted(enumerate(self.parts), key=lambda q: q[1], reverse=turn)
        for m in range(M):
            for j, c in chunks:
                k = bkey(m, j)
                if c == self.V - 1:
                    dout = None
                elif self.remote(c, c + 1):
                    dout = Ref(f"dout{m}.{j}")
                else:  # the input gradient of this rank's next part
                    dout = Ref(f"dx{m}.{local[c + 1]}")
                if split[m, j]:
                    g.add(
                        self._backward_input, m, j, Ref(f"act{m}.{j}"), dout,
                        name=name(Op.BACKWARD, m, j), out=f"dx{m}.{j}", priority=prio["B", m, j],
                    )  # fmt: skip
                    g.add(
                        self._backward_weight, m, j, Ref(f"dx{m}.{j}"),
                        name=name(Op.WEIGHT, m, j), inout=f"grads{j}", priority=n - k,
                    )  # fmt: skip
                else:
                    g.add(
                        self._backward, m, j, Ref(f"act{m}.{j}"), dout,
                        name=name(Op.BACKWARD, m, j), out=f"dx{m}.{j}", inout=f"grads{j}",
                        priority=prio["B", m, j],
                    )  # fmt: skip
                if self.remote(c, c - 1):
                    ev = Event()
                    g.add(
                        self._send_grad, m, j, Ref(f"dx{m}.{j}"), ev,
                        name=name(Op.SEND_GRAD, m, j), detach=ev, priority=pc - k,
                    )  # fmt: skip
        reduced = [f"grads{j}" for j in range(v)]
        if self.D > 1:  # posted in bucket order on every replica (priorities), overlapped
            for bk in self.buckets:
                ev = Event()
                bk.events[order] = ev
                g.add(
                    self._allreduce, bk, ev, name=f"allreduce[{bk.index}]",
                    in_=[f"grads{j}" for j in range(v)], out=f"g{bk.index}", detach=ev,
                    priority=pc - bk.index,
                )  # fmt: skip
                reduced.append(f"g{bk.index}")
        g.add(self._check, name="check-finite", in_=reduced, out="finite")
        g.add(self._update, name="update", in_="finite", inout="params")
        return g


@cache  # (the keys, the token and the priorities of one graph read it)
def v_sequence(S: int, M: int, s: int) -> tuple[tuple[str, int, int], ...]:
    """Rank stage ``s``'s forwards and backwards, ``(op, microbatch, chunk)``, in the
    order torch's ``ScheduleZBVZeroBubble`` gives a V of ``S`` ranks (chunk 0: part s,
    chunk 1: part 2S - 1 - s): ``2(S - s) - 1`` forwards of chunk 0, ``s`` pairs of
    forwards, ``S - s`` of chunk 1's forward and backward, then a forward and a backward
    of each chunk in turn, then the last backwards (a backward here is ZBV's input and
    weight gradient together: where the order splits it, W fills the bubbles)."""
    n = max(2 * S - 1, M)  # (as ZBV: enough microbatches to fill the V, the extra dropped)
    seq: list[tuple[str, int, int]] = []
    f = [0, 0]
    b = [0, 0]

    def put(op: str, j: int) -> None:
        c = f if op == "F" else b
        seq.append((op, c[j], j))
        c[j] += 1

    for _ in range(2 * (S - s) - 1):
        put("F", 0)
    for _ in range(s):
        put("F", 1)
        put("F", 0)
    for _ in range(S - s):
        put("F", 1)
        put("B", 1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            put("F", 0)
        put("B", 0)
        put("F", 1)
        put("B", 1)
    for _ in range(s):
        put("B", 0)
        put("B", 1)
    for _ in range(S - s):
        put("B", 0)
    return tuple((op, m, j) for op, m, j in seq if m < M)
