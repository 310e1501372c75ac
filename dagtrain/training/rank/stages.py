"""A pipeline rank's model: its own stage built, the other stages only described.

The whole model is described on the meta device (shapes, names, no memory): its
blocks, the split every rank agrees on (rank 0 times the blocks for ``split: auto``,
one real copy of one block at a time), and which ``state_dict`` keys each stage holds.
Then the rank builds its stage's blocks with exactly the values a whole-model build
from the same seed gives them (:func:`.materialize.materialize`); the other stages'
tensors stay on the meta device. So a rank's memory is its stage's, and a run is
bit-for-bit the run whose every rank built the whole model.

What the whole model did elsewhere, a stage does here: :func:`evaluate` runs the
evaluation as a pipeline (each stage's first replica passes the batches' activations
on; the last one computes the metrics, which every rank receives), and a checkpoint is
sharded by stage (:mod:`.checkpoint`), each stage writing its own keys.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dagtrain.config import TrainConfig
from dagtrain.errors import InputError

from .batches import cut, length, to_device
from .models import EVAL_BATCH, EVAL_OUTPUTS, check_parameters, output_sums, split_metrics
from .samples import evaluate_batches
from .split import Split, agreed_split, blocks_of

__all__ = ["Stages", "build_stages", "evaluate", "load_own", "own_state", "stage_blocks"]


@dataclass
class Stages:
    """This rank's model (its stage real, the others' tensors on the meta device), the
    whole model described, the split, and each stage's ``state_dict`` keys."""

    model: nn.Module
    meta: nn.Module
    split: Split
    keys: list[list[str]]
    stage: int


def build_stages(
    cfg: TrainConfig, backend: Any, build: Callable[[], nn.Module], sample: Any
) -> Stages:
    """Describe the model ``build`` makes, agree on its split, and build this rank's
    stage (seeded with ``training.seed``, as a whole-model build is) on its device."""
    from .materialize import describe, materialize, owned_names

    p = cfg.parallel
    replicas = backend.size // p.stages
    stage = backend.rank // replicas
    try:
        described = describe(build)  # on the meta device: no memory, no values
    except Exception as e:
        raise InputError(
            f"model {cfg.model.name!r}: parallel.stages builds each stage alone, from the "
            f"model described on the meta device first, and this factory cannot be "
            f"described there ({e}); make it build without reading tensors' values"
        ) from e
    meta = described.model
    check_parameters(meta, cfg.model)  # model.max_parameters, before any memory
    blocks = blocks_of(meta)
    device = torch.device(backend.device)
    mb = max(1, cfg.training.batch_size // (replicas * p.microbatches))
    split = agreed_split(
        backend, blocks, p.stages, p.split, to_device(cut(sample, 0, mb), device),
        real=lambda b: _real(b, device), chunks=p.chunks,
        placement=p.placement,
    )  # fmt: skip
    keys = stage_keys(meta, blocks, split)
    mine = stage_blocks(blocks, split, stage)
    # every tensor of the stage's blocks: its checkpointed keys, and buffers that are
    # not saved (persistent=False: a causal mask, rotary frequencies)
    owned = owned_names(meta, mine)
    torch.manual_seed(cfg.training.seed)  # (rank 0's timing drew from the generator)
    model = materialize(build, owned, described)
    nn.Sequential(*stage_blocks(blocks_of(model), split, stage)).to(device)
    return Stages(model, meta, split, keys, stage)


def stage_blocks(blocks: list[nn.Module], split: Split, stage: int) -> list[nn.Module]:
    """The blocks rank stage ``stage`` holds: its parts' (chunks'), in order."""
    return [blk for c in split.parts_of(stage) for blk in blocks[slice(*split.ranges[c])]]


def _real(block: nn.Module, device: torch.device) -> nn.Module:
    """A real copy of a block described on the meta device, to time: small random
    weights (its own generator: the run's is not touched), zero buffers."""
    blk = copy.deepcopy(block).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for q in blk.parameters():
            q.normal_(0.0, 0.02, generator=g)
        for buf in blk.buffers():
            buf.zero_()
    return blk


def stage_keys(meta: nn.Module, blocks: list[nn.Module], split: Split) -> list[list[str]]:
    """Each rank stage's ``state_dict`` keys (a tensor tied under two names: both). A
    tensor in two parts' blocks (two stages', or two chunks' of one stage: their
    backwards would each add into it), or in none, is refused: a part holds its blocks
    alone."""
    names: dict[int, list[str]] = {}
    for k, v in meta.state_dict(keep_vars=True).items():
        names.setdefault(id(v), []).append(k)
    owner: dict[str, int] = {}  # key -> part
    keys: list[list[str]] = [[] for _ in range(split.stages)]
    for c, (a, b) in enumerate(split.ranges):
        mine = keys[split.stage_of(c)]
        for blk in blocks[a:b]:
            for v in blk.state_dict(keep_vars=True).values():
                tied = names.get(id(v), [])
                for k in tied:
                    if owner.setdefault(k, c) != c:
                        raise InputError(
                            f"parallel.stages: {' and '.join(map(repr, tied))} "
                            f"{'are one tensor, ' if len(tied) > 1 else 'is '}used by "
                            f"{split.label(owner[k])} and {split.label(c)}: a tensor shared "
                            "between blocks must be in one part (choose parallel.split so "
                            "they are)"
                        )
                    if k not in mine:
                        mine.append(k)
    left = [k for ks in names.values() for k in ks if k not in owner]
    if left:
        raise InputError(
            f"parallel.stages: the model's {left[:3]} belong to none of its blocks(); "
            "every parameter and buffer must be in a block"
        )
    return keys


def own_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries of ``model``'s state this rank holds (a pipeline stage's; all of a
    whole model), not copied."""
    return {k: v for k, v in model.state_dict().items() if not v.is_meta}


def load_own(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load into the tensors of ``model`` this rank holds their entries of ``state``
    (which may hold more: another split's, the whole model's); InputError naming
    ``what`` if one is missing."""
    mine = own_state(model)
    missing = [k for k in mine if k not in state]
    if missing:
        raise InputError(
            f"{what} has no {missing[:3]}{' ...' if len(missing) > 3 else ''}: "
            "resume with the same model"
        )
    model.load_state_dict({k: state[k] for k in mine}, strict=False)


def evaluate(step: Any, samples: Any, split: str) -> dict[str, float]:
    """The split's metrics of a pipeline's model (a :class:`~.pipelining.StageStep`,
    every rank calls it; every rank gets them). The first replica of each part passes
    each evaluation batch's activation on, blocking, with a deadline; the last part
    computes. With chunks a batch goes round the stages v times, in the order of the
    parts, and each rank takes its parts of each batch in that order too."""
    # the last part's rank of replica 0 (the replicas' first ranks evaluate), for all
    backend, root = step.backend, step.split.stage_of(step.V - 1) * step.D
    row = None
    if step.replica == 0:
        per_sample = max(1, math.prod(step.shapes[-1][0]))
        size = max(1, min(EVAL_BATCH, EVAL_OUTPUTS // per_sample))
        total: dict[str, float] = {}
        timeout, rank = step.cfg.distributed.collective_timeout, backend.rank
        was = step.module.training
        step.module.eval()
        try:
            with torch.no_grad():
                for i, (x, y) in enumerate(evaluate_batches(samples, size)):
                    tag = step.free_tag + i  # (a training step's are below)
                    for c, module in zip(step.parts, step.modules):
                        if c == 0:
                            h = module(to_device(x, step.device))
                        elif not step.remote(c, c - 1):  # this rank's part before (a V)
                            h = module(h)
                        else:
                            shape, dtype = step.shapes[c - 1]
                            h = torch.empty((length(y), *shape), dtype=dtype, device=step.device)
                            peer = step.rank_of(c - 1)
                            what = (
                                f"rank {rank} ({step.where(c)}): receiving {split} batch {i}'s "
                                f"activation from rank {peer} ({step.where(c - 1)})"
                            )
                            backend.recv_async(h, peer, tag, what).wait(rank, timeout)
                            h = module(h)
                        if c == step.V - 1:
                            y = to_device(y, h.device)
                            for k, v in output_sums(h, y, step.objective).items():
                                total[k] = total.get(k, 0) + v
                        elif step.remote(c, c + 1):
                            peer = step.rank_of(c + 1)
                            what = (
                                f"rank {rank} ({step.where(c)}): sending {split} batch {i}'s "
                                f"activation to rank {peer} ({step.where(c + 1)})"
                            )
                            out = h.contiguous()
                            backend.send_async(out, peer, tag, what).wait(rank, timeout)
        finally:
            step.module.train(was)
        if step.last:
            row = split_metrics(total, split, step.objective)
    return backend.broadcast_object(row, root=root)
