"""Splitting a model into pipeline stages: its sequential blocks, their measured cost,
and the contiguous split that makes the slowest stage as fast as it can be.

A model is splittable when its blocks run in sequence, each reading only the output of
the one before: an ``nn.Sequential`` (its children; the built-in ``mlp``, ``cnn`` and
``rescnn`` are ones), a list of modules a user factory returned (it becomes an
``nn.Sequential``), or a model with a ``blocks()`` method returning such a list (the
built-in ``transformer``: embedding, each encoder layer, head). The blocks share the
model's parameters, so the whole model's ``state_dict`` is the checkpoint's, whatever
the split.

``split: auto`` times each block's forward and backward on a few microbatches and its
output's size (:func:`profile_blocks`), then :func:`balanced_split` picks the
boundaries that minimise the slowest stage (a linear-partition dynamic programme, with
the bytes sent between stages as the tie-breaker).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dagtrain.errors import InputError

__all__ = [
    "BlockCost",
    "Split",
    "agreed_split",
    "balanced_split",
    "blocks_of",
    "boundary_shapes",
    "check_blocks",
    "check_stages",
    "choose_split",
    "profile_blocks",
]

log = logging.getLogger(__name__)


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The blocks ``model`` runs in sequence; InputError if it has none to split."""
    if hasattr(model, "blocks") and callable(model.blocks):
        blocks = list(model.blocks())
    elif isinstance(model, nn.Sequential):
        blocks = list(model.children())
    else:
        raise InputError(
            f"parallel.stages needs a model whose blocks run in sequence: {type(model).__name__} "
            "is not an nn.Sequential and has no blocks() method; return an nn.Sequential "
            "(or a list of modules) from the model factory"
        )
    if not all(isinstance(b, nn.Module) for b in blocks):
        raise InputError("parallel.stages: every block of the model must be a torch.nn.Module")
    return blocks


@dataclass
class BlockCost:
    """One block's measured forward and backward seconds and its output's bytes per
    sample (what a stage boundary after it sends)."""

    forward: float
    backward: float
    out_bytes: int

    @property
    def total(self) -> float:
        return self.forward + self.backward


@dataclass
class Split:
    """Where a model is cut: ``bounds`` (S x v - 1 block indices, the first block of
    each part after the first) and, for each part, its blocks' range and measured cost.
    With ``chunks`` v > 1 rank stage s holds parts s, s + S, ... (``placement``
    looped), or, with v = 2, parts s and 2S - 1 - s (``v``)."""

    bounds: list[int]
    blocks: int
    how: str  # "auto" (measured) or "explicit"
    costs: list[BlockCost] = field(default_factory=list)
    chunks: int = 1
    placement: str = "looped"

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """Each part's blocks, ``[a, b)``, in the order a sample passes them."""
        edges = [0, *self.bounds, self.blocks]
        return list(zip(edges, edges[1:]))

    @property
    def stages(self) -> int:
        """S: the rank stages (parts / chunks)."""
        return (len(self.bounds) + 1) // self.chunks

    def parts_of(self, stage: int) -> list[int]:
        """The parts rank stage ``stage`` holds, its chunks in order."""
        if self.placement == "v":
            return [stage, 2 * self.stages - 1 - stage]
        return list(range(stage, len(self.bounds) + 1, self.stages))

    def stage_of(self, part: int) -> int:
        """The rank stage holding part ``part``."""
        S = self.stages
        if self.placement == "v" and part >= S:
            return 2 * S - 1 - part
        return part % S

    def label(self, part: int) -> str:
        """``stage s``, or with chunks ``stage s chunk j``: part ``part`` in words."""
        s = f"stage {self.stage_of(part)}"
        return s if self.chunks == 1 else f"{s} chunk {part // self.stages}"

    @property
    def stage_seconds(self) -> list[float]:
        if not self.costs:
            return []
        return [sum(c.total for c in self.costs[a:b]) for a, b in self.ranges]

    def describe(self) -> str:
        """One line: what each stage (or each stage's chunk) holds, and its measured
        share."""
        parts = []
        secs = self.stage_seconds
        for c, (a, b) in enumerate(self.ranges):
            held = f"block {a}" if b - a == 1 else f"blocks {a}-{b - 1}"
            cost = f" {secs[c] * 1e3:.2f} ms" if secs else ""
            parts.append(f"{self.label(c)}: {held}{cost}")
        return f"split ({self.how}, {self.blocks} blocks): " + "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "bounds": self.bounds,
            "blocks": self.blocks,
            "how": self.how,
            "chunks": self.chunks,
            "placement": self.placement,
            "ranges": self.ranges,
            "stage_ms": [round(s * 1e3, 4) for s in self.stage_seconds],
        }


def profile_blocks(
    blocks: Sequence[nn.Module],
    x: torch.Tensor,
    repeats: int = 3,
    real: Callable[[nn.Module], nn.Module] | None = None,
) -> list[BlockCost]:
    """Each block's median forward and backward seconds on input ``x`` (a microbatch),
    and its output's bytes per sample. The parameters' gradients are left as they were.

    ``real``: for blocks described on the meta device (a pipeline rank builds only its
    stage), a real copy of one to time; one block at a time is alive then."""
    costs = []
    h = x
    for b in blocks:
        blk = b if real is None else real(b)
        saved = [p.grad for p in blk.parameters()]
        fwd, bwd = [], []
        out_bytes = 0
        for _ in range(repeats + 1):  # the first pass warms up
            inp = h.detach().requires_grad_(h.is_floating_point())
            t0 = time.perf_counter()
            out = blk(inp)
            t1 = time.perf_counter()
            grad = torch.ones_like(out)
            t2 = time.perf_counter()
            if out.requires_grad:
                out.backward(grad)
            t3 = time.perf_counter()
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
            out_bytes = out[:1].numel() * out.element_size()
        for q, g in zip(blk.parameters(), saved):
            q.grad = g
        costs.append(BlockCost(_median(fwd[1:]), _median(bwd[1:]), out_bytes))
        h = out.detach()
        del blk, out
    return costs


def balanced_split(costs: Sequence[float], stages: int, sizes: Sequence[int] = ()) -> list[int]:
    """The S - 1 boundaries that cut ``costs`` (one per block) into ``stages``
    contiguous, non-empty parts whose largest sum is smallest; among equal ones, the
    one sending the fewest bytes (``sizes``: each block's output bytes)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    sent = list(sizes) or [0] * n
    inf = (math.inf, math.inf)
    # best[k][i]: (slowest stage, bytes sent) cutting blocks[:i] into k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0)
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                if prev is inf:
                    continue
                here = (
                    max(prev[0], prefix[i] - prefix[j]),
                    prev[1] + (sent[j - 1] if j else 0),
                )
                if here < best[k][i]:
                    best[k][i] = here
                    cut[k][i] = j
    bounds, i = [], n
    for k in range(stages, 1, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]


def choose_split(
    blocks: Sequence[nn.Module],
    stages: int,
    split: str | list[int],
    sample: torch.Tensor,
    real: Callable[[nn.Module], nn.Module] | None = None,
    chunks: int = 1,
    placement: str = "looped",
) -> Split:
    """The split ``parallel.split`` asks for (``stages`` x ``chunks`` parts, placed
    ``placement``): its boundaries checked against the model, or (``auto``) the
    balanced one measured on ``sample``. InputError names the field."""
    n, parts = len(blocks), stages * chunks
    if parts > n:
        raise InputError(
            f"parallel.stages is {stages}"
            + (f" with parallel.chunks {chunks} ({parts} parts)" if chunks > 1 else "")
            + f" but the model has {n} blocks to split: use at most {n} "
            + ("parts (parallel.stages x parallel.chunks)" if chunks > 1 else "stages")
            + ", or a deeper model"
        )
    if split != "auto":
        bounds = list(split)
        if bounds and bounds[-1] >= n:
            raise InputError(
                f"parallel.split {bounds}: the model has {n} blocks (0-{n - 1}), so each "
                f"boundary must be between 1 and {n - 1}"
            )
        return Split(bounds, n, "explicit", chunks=chunks, placement=placement)
    costs = profile_blocks(blocks, sample, real=real)
    bounds = balanced_split([c.total for c in costs], parts, [c.out_bytes for c in costs])
    return Split(bounds, n, "auto", costs, chunks, placement)


def check_stages(cfg, manifest: dict) -> int | None:
    """Refuse, before any rank starts, a pipeline the model cannot be split into (more
    stages than blocks, a boundary past the last block, a model with no blocks): the
    model built on the meta device (no memory, no time). A user factory is left to the
    ranks (it may import only where they run). Returns the model's block count."""
    from .models import MODELS, DataInfo, build_model

    p = cfg.parallel
    if p.stages == 1 or cfg.model.name not in MODELS:
        return None
    info = DataInfo.of(manifest, cfg.objective.name)
    with torch.device("meta"):
        model = build_model(cfg.model.name, info.in_shape, info.classes, info, **cfg.model.args)
    return check_blocks(model, p.stages, p.split, p.chunks)


def check_blocks(model: nn.Module, stages: int, split: str | list[int], chunks: int = 1) -> int:
    """InputError naming the field if ``model`` cannot be cut into ``stages`` x
    ``chunks`` parts as ``split`` says; its block count otherwise."""
    blocks = blocks_of(model)
    if stages * chunks > len(blocks) or split != "auto":
        choose_split(blocks, stages, split, None, chunks=chunks)  # (measures nothing)
    return len(blocks)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else 0.0


def agreed_split(
    backend: Any,
    blocks: list[nn.Module],
    stages: int,
    spec: str | list[int],
    sample: torch.Tensor,
    real: Callable[[nn.Module], nn.Module] | None = None,
    chunks: int = 1,
    placement: str = "looped",
) -> Split:
    """The split every rank uses: rank 0 chooses it (measuring ``sample``, one
    microbatch, where ``spec`` says ``auto``) and broadcasts it; an InputError it met is
    raised on every rank."""
    split: Split | str | None = None
    if backend.rank == 0:
        try:
            split = choose_split(blocks, stages, spec, sample, real, chunks, placement)
        except InputError as e:
            split = str(e)
    chosen = backend.broadcast_object(
        split.to_dict() if isinstance(split, Split) else {"error": split}
    )
    if "error" in chosen:
        raise InputError(chosen["error"])
    if isinstance(split, Split):
        log.info("pipeline %s", split.describe())
        return split
    return Split(
        chosen["bounds"], chosen["blocks"], chosen["how"], chunks=chosen["chunks"],
        placement=chosen["placement"],
    )  # fmt: skip


def boundary_shapes(
    model: nn.Module, blocks: list[nn.Module], split: Split, sample: torch.Tensor
) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The shape (per sample) and dtype of each stage's output, from one sample."""
    was = model.training
    model.eval()
    out = []
    with torch.no_grad():
        h = sample
        for a, b in split.ranges:
            for blk in blocks[a:b]:
                h = blk(h)
            out.append((tuple(h.shape[1:]), h.dtype))
    model.train(was)
    return out
