"""The per-rank training step as a TaskGraph, built once and replayed every step.

Gradients live in flat bucket buffers (each parameter's ``.grad`` is a view into its
bucket, so a bucket is reduced without a copy). Buckets follow the reverse order of
the parameters, the order backward produces their gradients in::

    load-next ───────────────────────────────────────────── (prefetch of step t+1)
    forward+backward ──(hooks fulfil bucket events)
        bucket[0] ready ─ allreduce[0] ─ update[0] ┐
        bucket[1] ready ─ allreduce[1] ─ update[1] ┼─ snapshot (checkpoint steps)
        ...                                        ┘

``bucket[k] ready`` is a detached task: ``register_post_accumulate_grad_hook`` counts
the bucket's parameters and fulfils its event when the last one's gradient is in, so
bucket k's allreduce starts while backward still computes the buckets after it. The
allreduce tasks are chained (``inout="comm"``) so every rank issues them in the same
order. Each update starts as soon as its own bucket is averaged. ``overlap=False``
builds the plain step instead: backward, then every allreduce, then every update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dagtrain.config import TrainConfig
from dagtrain.sync import Backend
from dagtrain.taskgraph import Event, TaskGraph, TraceFile

__all__ = ["Bucket", "NonFiniteGradients", "StepGraph"]


class NonFiniteGradients(FloatingPointError):
    """The averaged gradient of a bucket holds NaN or infinity (``nonfinite: fail``)."""

    def __init__(self, step: int, bucket: int, names: list[str]) -> None:
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        super().__init__(
            f"step {step}: non-finite gradients in bucket {bucket} ({shown}); lower the "
            "learning rate, check the data, or set nonfinite: skip to skip such steps"
        )
        self.step = step
        self.bucket = bucket


class Bucket:
    """Parameters whose gradients are reduced together, in one flat buffer."""

    def __init__(self, index: int, params: list[tuple[str, nn.Parameter]]) -> None:
        self.index = index
        self.names = [n for n, _ in params]
        self.params = [p for _, p in params]
        numel = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(numel, dtype=self.params[0].dtype)
        offset = 0
        for p in self.params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.event = Event()
        self.pending = len(self.params)
        self.optimizer: torch.optim.Optimizer | None = None


def make_buckets(model: nn.Module, bucket_mb: float) -> list[Bucket]:
    cap = max(1, int(bucket_mb * 2**20))
    groups: list[list[tuple[str, nn.Parameter]]] = [[]]
    size = 0
    for name, p in reversed(list(model.named_parameters())):
        if not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        if groups[-1] and size + nbytes > cap:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += nbytes
    return [Bucket(i, g) for i, g in enumerate(groups) if g]


def make_optimizer(cfg: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    t = cfg.training
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)


class StepGraph:
    """One rank's step: ``run(batch_x, batch_y, global_count)`` -> summed loss, correct.

    ``next_batch`` is a callable the prefetch task calls for the following step.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        backend: Backend,
        snapshot: Callable[..., None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.buckets = make_buckets(model, cfg.distributed.bucket_mb)
        for b in self.buckets:
            # one optimizer per bucket: SGD, Adam and AdamW are elementwise, so this is
            # the same update as one optimizer over all parameters
            b.optimizer = make_optimizer(cfg, b.params)
        self.loss_fn = nn.CrossEntropyLoss(reduction="sum")
        self.step = 0
        self.batch: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.fetch: Callable[[], tuple[torch.Tensor, torch.Tensor, int] | None] = lambda: None
        self.prefetched: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.snapshot = snapshot
        self.want_snapshot = False
        self.finite = True
        self.skipped = 0
        self.out = (0.0, 0, 0)
        self._hooks = []
        # one bucket leaves nothing to overlap: its allreduce waits for all of backward
        # anyway, and the plain step is cheaper
        self.overlap = cfg.distributed.overlap and len(self.buckets) > 1
        if self.overlap:
            for b in self.buckets:
                for p in b.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(b)))
        self.graph = self._build()

    # ------------------------------------------------------------------ graph
    def _build(self) -> TaskGraph:
        g = TaskGraph("train-step")
        params = [f"params{b.index}" for b in self.buckets]
        g.add(self._load_next, name="load-next", out="next-batch")
        if not self.overlap:
            g.add(self._forward_backward, name="forward-backward", in_=params, out="grads")
            g.add(self._allreduce_all, name="allreduce", inout="grads")
            g.add(self._update_all, name="update", in_="grads", inout=params)
        else:
            g.add(self._forward_backward, name="forward-backward", in_=params, out="loss")
            skip = self.cfg.training.nonfinite == "skip"
            for b in self.buckets:
                k = b.index
                g.add(_noop, name=f"bucket[{k}]-ready", out=f"grad{k}", detach=b.event)
                g.add(self._allreduce, b, name=f"allreduce[{k}]", inout=(f"grad{k}", "comm"))
            if skip:
                g.add(
                    self._check_all,
                    name="check-finite",
                    in_=[f"grad{b.index}" for b in self.buckets],
                    out="finite",
                )
            for b in self.buckets:
                k = b.index
                g.add(
                    self._update,
                    b,
                    name=f"update[{k}]",
                    in_=(f"grad{k}", "finite") if skip else f"grad{k}",
                    inout=f"params{k}",
                )
        g.add(self._snapshot, name="snapshot", in_=params)
        return g

    def _hook(self, b: Bucket) -> Callable[[torch.Tensor], None]:
        def fire(_: torch.Tensor) -> None:
            b.pending -= 1
            if b.pending == 0:
                b.event.fulfill()

        return fire

    # ------------------------------------------------------------------ tasks
    def _load_next(self) -> None:
        self.prefetched = self.fetch()

    def _forward_backward(self) -> None:
        x, y, count = self.batch
        for b in self.buckets:
            b.flat.zero_()
            b.pending = len(b.params)
        self.model.train()
        # the CPU generator only: torch.manual_seed also queues seeds for CUDA, MTIA and
        # XPU, formatting a stack trace each time (0.8 ms a step)
        torch.default_generator.manual_seed(
            _step_seed(self.cfg.training.seed, self.backend.rank, self.step)
        )
        if len(x):
            out = self.model(x)
            # sum / global count * world: averaged over the ranks, this is the mean loss
            # of the whole global batch, however unevenly its last part was split
            loss = self.loss_fn(out, y) * (self.backend.size / count)
            loss.backward()
            correct = int((out.argmax(dim=1) == y).sum())
            self.out = (loss.item() * count / self.backend.size, correct, len(x))
        else:
            self.out = (0.0, 0, 0)
        if self.overlap:
            for b in self.buckets:  # parameters that got no gradient (unused) never hook
                b.event.fulfill()

    def _allreduce(self, b: Bucket) -> None:
        self.backend.allreduce(b.flat, f"bucket{b.index}")
        if self.cfg.training.nonfinite == "fail" and not _finite(b.flat):
            raise NonFiniteGradients(self.step, b.index, b.names)

    def _check_all(self) -> None:
        # averaged gradients are the same on every rank, so every rank decides alike
        self.finite = all(_finite(b.flat) for b in self.buckets)
        if not self.finite:
            self.skipped += 1

    def _update(self, b: Bucket) -> None:
        if self.cfg.training.nonfinite == "skip" and not self.finite:
            return
        b.optimizer.step()

    def _allreduce_all(self) -> None:
        for b in self.buckets:
            self._allreduce(b)
        if self.cfg.training.nonfinite == "skip":
            self._check_all()

    def _update_all(self) -> None:
        for b in self.buckets:
            self._update(b)

    def _snapshot(self) -> None:
        if self.want_snapshot and self.snapshot is not None:
            self.snapshot(self.step + 1)

    # ------------------------------------------------------------------ driving
    def run(
        self,
        batch: tuple[torch.Tensor, torch.Tensor, int],
        snapshot: bool = False,
        trace: str | None = None,
    ) -> tuple[float, int, int]:
        """Run one step on ``batch``; returns (loss sum over the global batch / world,
        correct predictions here, samples here)."""
        self.batch = batch
        self.want_snapshot = snapshot
        self.finite = True
        rank = self.backend.rank
        self.graph.run(
            workers=self.cfg.executor.workers,
            trace=None if trace is None else TraceFile(trace, rank, f"rank {rank}"),
            timeout=self.cfg.distributed.collective_timeout * (len(self.buckets) + 2),
        )
        self.step += 1
        return self.out

    def optimizer_states(self) -> list[dict[str, Any]]:
        return [b.optimizer.state_dict() for b in self.buckets]

    def load_optimizer_states(self, states: list[dict[str, Any]]) -> None:
        if len(states) != len(self.buckets):
            raise ValueError(
                f"the checkpoint has {len(states)} optimizer buckets, this run "
                f"{len(self.buckets)}: resume with the same model and bucket_mb"
            )
        for b, s in zip(self.buckets, states):
            b.optimizer.load_state_dict(s)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _finite(flat: torch.Tensor) -> bool:
    """No NaN or infinity in ``flat``: one pass, no temporary (isfinite(t).all() makes
    a bool tensor as large as the bucket). NaN and infinities survive a sum; a finite
    sum that overflows means gradients near 1e38, which are no better."""
    return math.isfinite(float(flat.sum()))


def _noop() -> None:
    return None


def _step_seed(seed: int, rank: int, step: int) -> int:
    """A seed per (run, rank, step): dropout is reproducible across a resume without
    saving every rank's generator."""
    return (seed * 1_000_003 + rank * 10_007 + step) % (2**63 - 1)
