"""A pipeline stage's step as one TaskGraph per order: the tasks of each microbatch
and chunk (docs in :mod:`.pipelining`, whose :class:`~.pipelining.StageStep` runs
them), their priorities (each order's sequence) and the token (how many forwards may
be alive). The task bodies are the step's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagtrain.records.trace import Op
from dagtrain.taskgraph import Event, Ref, TaskGraph

# the orders whose backward is two tasks: B (the input gradient) and W (the weights')
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

    def _name(self, op: Op, m: int, j: int) -> str:
        return op(m, j if self.v > 1 else None)

    def _keys(self, order: str) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
        """The place of microbatch m's forward and backward through chunk j in the
        order's sequence of this rank's forwards and of its backwards."""
        M, S, v = self.M, self.S, self.v
        if order == "gpipe":  # (looped BFS with chunks: chunk by chunk, every microbatch)
            return (lambda m, j: j * M + m), (lambda m, j: (v - 1 - j) * M + m)
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
        # interleaved 1F1B's warm-up (Megatron-LM's), and the forward it overlaps
        return min(n, 2 * (self.S - s - 1) + (self.v - 1) * self.S + 1)

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
        if back_first and v > 1:
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
        # microbatch's activations (where the order splits backward: W)
        split = [order in _SPLIT_ORDERS and c > 0 for c in self.parts]
        frees = {}
        for m in range(M):
            for j in range(v):
                frees[bkey(m, j)] = self._name(Op.WEIGHT if split[j] else Op.BACKWARD, m, j)
        name = self._name
        g.add(self._load_next, name="load-next", out="next-batch")
        # while the stage waits for its first input, not before the step
        g.add(
            self._zero_grads, name="zero-grads", out=[f"grads{j}" for j in range(v)],
            priority=pc,
        )  # fmt: skip
        for m in range(M):
            for j, c in enumerate(self.parts):
                k = fkey(m, j)
                token = (frees[k - alive],) if k >= alive else ()
                if c > 0:
                    ev = Event()
                    g.add(
                        self._recv_act, m, j, ev, name=name(Op.RECV_ACT, m, j),
                        out=f"in{m}.{j}", detach=ev, after=token, priority=pc - k,
                    )  # fmt: skip
                g.add(
                    self._forward, m, j, Ref(f"in{m}.{j}") if c > 0 else None,
                    name=name(Op.FORWARD, m, j), out=f"act{m}.{j}", in_="params",
                    after=token, priority=prio["F", m, j],
                )  # fmt: skip
                if c < self.V - 1:
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
        for m in range(M):
            for j, c in enumerate(self.parts):
                k = bkey(m, j)
                dout = Ref(f"dout{m}.{j}") if c < self.V - 1 else None
                if split[j]:
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
                if c > 0:
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
