"""The ops of a pipeline stage's step, as its trace names them, and its bubble.

A stage rank's step graph names each compute op by its kind and microbatch (``F3``:
the forward of microbatch 3, ``B3`` its backward or input gradient, ``W3`` its weight
gradient) and each transfer by direction and microbatch (``send-act3``,
``recv-grad3``); with chunks (``parallel.chunks`` > 1: a rank holds several parts of
the model) the name ends with the chunk, ``F3.1`` the forward of microbatch 3 through
the rank's chunk 1. The pipeline step builds the names with :class:`Op`; the training
page reads them back with :func:`parse_op`, and its merged trace hands each op's kind
and microbatch to the page's script as the span's ``args`` (:func:`op_args`): the
script never reads a name. The bubble, one definition for the step (its result) and
the page (its traces), is :func:`bubble`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

__all__ = ["COMPUTE", "Op", "bubble", "chunk_of", "is_compute", "op_args", "parse_op"]


class Op(StrEnum):
    """A pipeline op's kind; ``Op.FORWARD(3)`` is its name for microbatch 3,
    ``Op.FORWARD(3, 1)`` for microbatch 3 through the rank's chunk 1."""

    FORWARD = "F"
    BACKWARD = "B"  # the input gradient where the order splits backward, else all of it
    WEIGHT = "W"  # the weights' gradient, split from backward
    SEND_ACT = "send-act"
    RECV_ACT = "recv-act"
    SEND_GRAD = "send-grad"
    RECV_GRAD = "recv-grad"

    def __call__(self, m: int, chunk: int | None = None) -> str:
        return f"{self.value}{m}" if chunk is None else f"{self.value}{m}.{chunk}"

    @property
    def way(self) -> str | None:
        """A transfer's way, ``send`` or ``recv``; None for a compute op."""
        return self.value.partition("-")[0] if "-" in self.value else None

    @property
    def carries(self) -> str | None:
        """What a transfer moves, ``act`` (activations) or ``grad`` (their gradients);
        None for a compute op."""
        return self.value.partition("-")[2] or None


COMPUTE = frozenset({Op.FORWARD, Op.BACKWARD, Op.WEIGHT})

_NAME = re.compile(r"(F|B|W|send-act|recv-act|send-grad|recv-grad)(\d+)(?:\.(\d+))?")


def parse_op(name: str) -> tuple[Op, int] | None:
    """``(kind, microbatch)`` of a pipeline op's name; None for any other task."""
    m = _NAME.fullmatch(name)
    return (Op(m.group(1)), int(m.group(2))) if m else None


def chunk_of(name: str) -> int | None:
    """The chunk of a pipeline op's name (``F3.1``: 1); None without one."""
    m = _NAME.fullmatch(name)
    return int(m.group(3)) if m and m.group(3) is not None else None


def op_args(name: str) -> dict[str, Any]:
    """What a span named ``name`` is, as fields for its trace event's ``args``: ``op``
    (the :class:`Op`'s value: ``F``, ``B``, ``W``, ``send-act``, ...) and
    ``microbatch`` (and ``chunk`` where the rank holds several), and for a transfer
    ``way`` (``send``, ``recv``) and ``carries`` (``act``, ``grad``); none for any other
    task."""
    got = parse_op(name)
    if got is None:
        return {}
    op, m = got
    fields: dict[str, Any] = {"op": op.value, "microbatch": m}
    chunk = chunk_of(name)
    if chunk is not None:
        fields["chunk"] = chunk
    if op.way is not None:
        fields |= {"way": op.way, "carries": op.carries}
    return fields


def is_compute(name: str) -> bool:
    got = parse_op(name)
    return got is not None and got[0] in COMPUTE


def bubble(ops: Iterable[tuple[str, float, float]]) -> tuple[float, float, float] | None:
    """A stage rank's bubble in one step from its ops ``(name, start, end)``: ``(1 -
    busy / span, busy, span)``, ``busy`` the time its F/B/W ops ran (their union:
    overlaps counted once), ``span`` the step's (the first op's start to the last op's
    end, every op). None without F/B/W ops or with an empty span."""
    ops = list(ops)
    compute = sorted((a, b) for name, a, b in ops if is_compute(name))
    if not compute:
        return None
    span = max(b for _, _, b in ops) - min(a for _, a, _ in ops)
    busy, reach = 0.0, float("-inf")
    for a, b in compute:
        if b > reach:
            busy += b - max(a, reach)
            reach = b
    return (max(0.0, 1 - busy / span), busy, span) if span > 0 else None
