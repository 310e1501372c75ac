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
order. Each update starts as soon as its own bucket is averaged (and backward, which
reads the parameters, is over).

The plain step is the other graph: backward, then every allreduce, then every update,
in the calling thread alone. It runs with ``overlap: false``, when the model has one
bucket (nothing to overlap), and unless rank 0 measures the overlapped step faster,
all along the run (see :mod:`.overlap`): on cores that the ranks' backward fills, an
allreduce is CPU work that competes with backward. Both give the same parameters, bit
for bit.

Passes over the gradients, each a pass over every byte of them (84 MB for the 21M MLP,
~4 ms on this machine): backward's gradient is copied into its bucket (the
post-accumulate hook; zeroing the bucket and letting autograd add into it cost two
more); the bucket is summed over the ranks; one pass divides the sum by the world size
and checks it for NaN and infinity (GradScaler's fused kernel); the optimizer update.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch
from torch import nn

from dagtrain.config import TrainConfig
from dagtrain.sync import Backend
from dagtrain.taskgraph import TaskGraph, TraceFile

from .batches import cut, length, to_device
from .buckets import Bucket, make_buckets
from .models import evaluate_samples
from .objective import Objective, objective_of
from .optimizers import make_optimizer
from .overlap import OverlapChoice
from .recipe import Precision, clip_factor, lr_at

__all__ = [
    "Bucket",
    "NonFiniteGradients",
    "OverlapChoice",
    "StepGraph",
    "scaled_loss",
    "step_seed",
]

log = logging.getLogger(__name__)


class NonFiniteGradients(FloatingPointError):
    """The averaged gradient of a bucket (a pipeline's: of a stage) holds NaN or
    infinity (``nonfinite: fail``)."""

    def __init__(self, step: int, bucket: int, names: list[str], where: str = "bucket") -> None:
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        super().__init__(
            f"step {step}: non-finite gradients in {where} {bucket} ({shown}); lower the "
            "learning rate, check the data, or set nonfinite: skip to skip such steps"
        )
        self.step = step
        self.bucket = bucket


def scaled_loss(
    objective: Objective, out: torch.Tensor, y: Any, count: int, world: int
) -> tuple[torch.Tensor, tuple[float, ...]]:
    """(the loss to start backward from, the sums of this batch): the objective's loss
    of ``out`` on ``y`` divided by the global batch's units (``count`` samples with the
    same units each) over ``world`` (the replicas that average their gradients):
    averaged over them, it is the mean loss of the whole global batch, however unevenly
    its last part was split. The sums: the loss, the tallies, the units."""
    n = len(y)
    units = objective.units(y)
    total = count * (units // n) if units % n == 0 else count * units / n
    loss = objective.loss(out, y) * (world / total)
    # numbers, not tensors (an author's tally may give either): they are summed and kept
    tallies = [
        v if isinstance(v, (int, float)) else float(v) for v in objective.tally(out.detach(), y)
    ]
    return loss, (loss.item() * total / world, *tallies, units)


class StepGraph:
    """One rank's data-parallel step (a :class:`~.protocol.TrainStep`):
    ``run((x, y, global_count))`` -> this rank's sums (the loss, the objective's
    tallies, the units).

    ``next_batch`` is a callable the prefetch task calls for the following step.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        backend: Backend,
        snapshot: Callable[..., None] | None = None,
        objective: Objective | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.objective = objective or objective_of(cfg.objective)
        self.backend = backend
        # each rank is a replica of its own, reading its share of each batch
        self.replica, self.replicas = backend.rank, backend.size
        self.buckets = make_buckets(model, cfg.distributed.bucket_mb)
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        for b in self.buckets:
            # one optimizer per bucket: SGD, Adam and AdamW are elementwise, so this is
            # the same update as one optimizer over all parameters
            b.optimizer = make_optimizer(cfg, [b.param])
        self.step = 0
        self.batch: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.fetch: Callable[[], tuple[torch.Tensor, torch.Tensor, int] | None] = lambda: None
        self.prefetched: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.snapshot = snapshot
        self.want_snapshot = False
        self.finite = True
        self.skipped = 0
        t = cfg.training
        # the recipe: the run's steps (the trainer sets them: the LR is a function of the
        # global step and of them), autocast and fp16's loss scale, clipping, chunks
        self.total = 1
        self.precision = Precision(cfg, self.device)
        self.chunks = t.accumulation_steps
        self._final_chunk = True  # backward of a step's last chunk: buckets may go
        self.lr: float | None = None  # the newest step's LR, its norm before clipping
        self.norm: float | None = None
        self.factor = 1.0
        # every update waits for every bucket's average where a step may be skipped
        # (nonfinite: skip, fp16's scale) or the gradient is clipped (its global norm)
        self.gated = t.nonfinite == "skip" or t.max_grad_norm is not None or self.precision.scaled
        self.none = (0.0,) * len(self.objective.sum_names)  # a rank with no samples
        self.out = self.none
        # the steps whose updates are applied (set as the last update ends), and the lock
        # the updates hold (an elastic run's rescue takes it to copy a whole step)
        self.completed = 0
        self.guard = threading.Lock()
        self._hooks = []
        # one bucket leaves nothing to overlap: its allreduce waits for all of backward
        # anyway, and the plain step is cheaper
        self.overlap = cfg.distributed.overlap and len(self.buckets) > 1
        self.overlapping = self.overlap  # the kind of step that runs now
        # the plain step is a chain (the prefetch aside, ~0.1 ms of indexing): it runs
        # in the calling thread. A helper thread would be started and joined every step,
        # and on cores shared with the other ranks that cost 1-5 ms a step (see
        # benchmarks/README.md, "Training throughput")
        self.workers = cfg.executor.workers if self.overlap else 1
        # which kind of step runs, where both can (a resumed run measures again)
        self.choice = OverlapChoice(backend) if self.overlap else None
        # 1/world where that is exact (a power of two: x * 2**-k is x / 2**k, bit for bit)
        # the pass that checks a bucket also averages it; otherwise it divides first
        size = backend.size
        self._inv = 1.0 / size if size & (size - 1) == 0 else None
        for b in self.buckets:
            b.inv = torch.full((1,), self._inv or 1.0, dtype=torch.float32, device=b.flat.device)
            for i, (p, view) in enumerate(zip(b.params, b.grads)):
                # to copy a large gradient in; to count them all, where overlap can run
                if self.overlap or i in b.copied:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(b, view)))
        self.plain_graph = self._build(overlap=False)
        self.graph = self._build(overlap=True) if self.overlap else self.plain_graph

    # ------------------------------------------------------------------ graph
    def _build(self, overlap: bool) -> TaskGraph:
        g = TaskGraph("train-step")
        params = [f"params{b.index}" for b in self.buckets]
        g.add(self._load_next, name="load-next", out="next-batch")
        if not overlap:
            g.add(self._forward_backward, name="forward-backward", in_=params, out="grads")
            g.add(self._allreduce_all, name="allreduce", inout="grads")
            g.add(self._update_all, name="update", in_="grads", inout=params)
        else:
            g.add(self._forward_backward, name="forward-backward", in_=params, out="loss")
            skip = self.gated
            for b in self.buckets:
                k = b.index
                g.add(_noop, name=f"bucket[{k}]-ready", out=f"grad{k}", detach=b.event)
                g.add(self._allreduce, b, name=f"allreduce[{k}]", inout=(f"grad{k}", "comm"))
            if skip:
                g.add(
                    self._check_all,
                    name="clip" if self.cfg.training.max_grad_norm else "check-finite",
                    in_=[f"grad{b.index}" for b in self.buckets],
                    out="finite",
                )
            if self.cfg.distributed.elastic:
                # all of the step's updates or none: they wait for every allreduce, so a
                # rank that loses a peer mid-step still holds the last completed step
                grads = [f"grad{b.index}" for b in self.buckets]
                g.add(
                    self._update_all,
                    name="update",
                    in_=[*grads, "finite"] if skip else grads,
                    inout=params,
                )
            else:
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

    def _hook(self, b: Bucket, view: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def fire(p: torch.Tensor) -> None:
            grad = p.grad
            # backward's gradient (autograd kept its own tensor, as .grad was None) into
            # the bucket: one pass, where zeroing the bucket and adding into it were two
            # (the 21M MLP's backward in one process: 88.6 -> 84.8 ms at the median)
            if grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
                p.grad = view
            b.pending -= 1
            # a plain step must not fulfil: the event would be kept for the next run; an
            # earlier chunk's backward neither (its gradient is not the step's yet)
            if b.pending == 0 and self.overlapping and self._final_chunk:
                b.event.fulfill()

        return fire

    # ------------------------------------------------------------------ tasks
    def _load_next(self) -> None:
        self.prefetched = self.fetch()

    def _forward_backward(self) -> None:
        x, y, count = self.batch
        if self.device.type != "cpu":  # batches are cut on the host
            x, y = to_device(x, self.device), to_device(y, self.device)
        for b in self.buckets:
            if not b.copied:  # every gradient is added into the bucket: zero it
                b.flat.zero_()
            else:  # backward hands large gradients over (.grad None), a hook copies them
                for i in b.copied:
                    b.params[i].grad = None
                for i in b.added:
                    b.grads[i].zero_()
            b.pending = len(b.params)
        if not self.model.training:  # evaluation left it in eval mode (train() walks
            self.model.train()  # every module: 0.06 ms a step for the residual CNN)
        # the CPU generator only: torch.manual_seed also queues seeds for CUDA, MTIA and
        # XPU, formatting a stack trace each time (0.8 ms a step)
        seed = step_seed(self.cfg.training.seed, self.backend.rank, self.step)
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":  # dropout on a GPU draws from its own generator
            torch.cuda.manual_seed(seed)
        n, k = length(y), self.chunks
        if k == 1:
            self._chunk(x, y, count, final=True)
            return
        # accumulation: the share in k chunks, added into the buckets; only the last
        # chunk's backward lets each bucket go to its allreduce
        sizes = [len(c) for c in torch.tensor_split(torch.arange(n), k)]
        a, sums = 0, [0.0] * len(self.none)
        for i, size in enumerate(sizes):
            self._chunk(cut(x, a, a + size), cut(y, a, a + size), count, final=i == k - 1)
            a += size
            sums = [u + v for u, v in zip(sums, self.out)]
            if i < k - 1:  # the next chunk's backward adds into what this one left
                for b in self.buckets:
                    b.pending = len(b.params)
        self.out = tuple(sums)

    def _chunk(self, x: Any, y: Any, count: int, final: bool) -> None:
        """Forward and backward of (a chunk of) this rank's share; the sums in ``out``."""
        self._final_chunk = final
        if length(y):
            with self.precision.autocast():
                out = self.model(x)
                loss, self.out = scaled_loss(self.objective, out, y, count, self.backend.size)
            if self.precision.scaled:
                loss = loss * self.precision.scale
            loss.backward()
        else:
            self.out = self.none
        for b in self.buckets:
            for i in b.copied:  # a parameter unused here got no gradient
                p = b.params[i]
                if p.grad is None:
                    b.grads[i].zero_()
                    p.grad = b.grads[i]
            if final and self.overlapping:
                b.event.fulfill()

    def _allreduce(self, b: Bucket) -> None:
        self.backend.allreduce(b.flat, f"bucket{b.index}", average=False)
        b.finite = _average_checked(b, self.backend.size, self._inv, self.precision.scale)
        fail = self.cfg.training.nonfinite == "fail" and not self.precision.scaled
        if fail and not b.finite:
            raise NonFiniteGradients(self.step, b.index, b.names)

    def _check_all(self) -> None:
        # averaged gradients are the same on every rank, so every rank decides alike
        self.finite = all(b.finite for b in self.buckets)
        self.precision.update(self.finite)  # fp16: a non-finite step lowers the scale
        if not self.finite:
            self.skipped += 1
            return
        max_norm = self.cfg.training.max_grad_norm
        if max_norm is not None:
            norms = torch._foreach_norm([b.flat for b in self.buckets])
            self.norm = float(torch.linalg.vector_norm(torch.stack(norms)))
            self.factor = clip_factor(self.norm, max_norm)
            if self.factor < 1.0:
                torch._foreach_mul_([b.flat for b in self.buckets], self.factor)

    def _update(self, b: Bucket) -> None:
        if self.gated and not self.finite:
            return
        b.optimizer.step()

    def _allreduce_all(self) -> None:
        for b in self.buckets:
            self._allreduce(b)
        if self.gated:
            self._check_all()

    def _update_all(self) -> None:
        # the rescue of an elastic run (.rescue) holds the guard while it copies the
        # state: it sees this step's updates all done or not begun
        with self.guard:
            for b in self.buckets:
                self._update(b)
            self.completed = self.step + 1

    def _snapshot(self) -> None:
        if self.want_snapshot and self.snapshot is not None:
            self.snapshot(self.step + 1)

    # ------------------------------------------------------------------ driving
    def run(
        self,
        batch: tuple[Any, Any, int],
        snapshot: bool = False,
        trace: str | None = None,
    ) -> tuple[float, ...]:
        """Run one step on ``batch`` (input, target, samples in the global batch);
        returns this rank's sums, named by the objective's ``sum_names`` (the loss, the
        tallies, the units)."""
        self.batch = batch
        self.want_snapshot = snapshot
        self.finite = True
        self.norm, self.factor = None, 1.0
        self.lr = lr_at(self.cfg.training, self.step, self.total)
        for b in self.buckets:  # a few dict writes: the step's LR, a function of the step
            for group in b.optimizer.param_groups:
                group["lr"] = self.lr
            if self.precision.scaled:  # fp16: the average also unscales
                b.inv.fill_((self._inv or 1.0) / self.precision.scale)
        rank = self.backend.rank
        if self.choice is not None:  # every rank, at every step: it may broadcast
            self.overlapping = self.choice.next(traced=trace is not None, step=self.step)
        overlapping = self.overlapping
        t0 = perf_counter()
        (self.graph if overlapping else self.plain_graph).run(
            workers=self.workers if overlapping else 1,
            trace=None if trace is None else TraceFile(trace, rank, f"rank {rank}"),
            timeout=self.cfg.distributed.collective_timeout * (len(self.buckets) + 2),
        )
        if self.choice is not None:
            self.choice.done(perf_counter() - t0)
        self.step += 1
        return self.out

    def evaluate(self, samples: Any, split: str) -> dict[str, float]:
        """The split's metrics of the model, evaluated by rank 0 ({} elsewhere)."""
        if self.backend.rank != 0:
            return {}
        return evaluate_samples(self.model, samples, split, self.objective)

    def optimizer_states(self) -> list[dict[str, Any]]:
        """Per bucket, the ``state_dict`` an optimizer over the bucket's parameters one
        by one would have (the checkpoint format does not depend on the flat buffers).
        Its tensors are views of the live state: copy them to keep them."""
        return [_per_parameter(b) for b in self.buckets]

    def load_optimizer_states(self, states: list[dict[str, Any]]) -> None:
        """Load what :meth:`optimizer_states` returned, whatever the bucket layout it
        was saved with: buckets hold consecutive parameters in the same order under any
        ``bucket_mb``, and the optimizers are elementwise."""
        per_param: list[dict[str, Any]] = []
        for s in states:
            for group in s["param_groups"]:
                per_param += [s["state"].get(i, {}) for i in group["params"]]
        ours = [p for b in self.buckets for p in b.params]
        if len(per_param) != len(ours):
            raise ValueError(
                f"the checkpoint's optimizer state has {len(per_param)} parameters, this "
                f"model {len(ours)}: resume with the same model"
            )
        hyper = {k: v for k, v in states[0]["param_groups"][0].items() if k != "params"}
        start = 0
        for b in self.buckets:
            mine = per_param[start : start + len(b.params)]
            start += len(b.params)
            b.optimizer.load_state_dict(
                {"state": _flat_state(b, mine), "param_groups": [{**hyper, "params": [0]}]}
            )

    def placement(self) -> dict[str, int]:
        return {}  # not a pipeline

    def describe(self) -> None:
        return None

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


# GradScaler's kernel: multiplies tensors by a scale and flags NaN and infinity, in one
# pass (CPU and CUDA; private to torch, hence the fallback)
_unscale = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


def scaled_finite(
    tensors: list[torch.Tensor], found: torch.Tensor, inv: torch.Tensor
) -> bool | None:
    """Multiply ``tensors`` by ``inv`` and say whether they hold no NaN or infinity, in
    one pass and one call (GradScaler's kernel; ``found`` and ``inv``: float32 tensors
    of one element on their device, ``found`` its flag); None where the kernel does not
    take them."""
    if _unscale is None:
        return None
    found.zero_()
    try:
        _unscale(tensors, found, inv)
    except (RuntimeError, TypeError):  # a dtype or device it does not take
        return None
    return not bool(found.item())


def all_finite(tensors: list[torch.Tensor], found: torch.Tensor, one: torch.Tensor) -> bool:
    """Whether ``tensors`` hold no NaN or infinity (:func:`scaled_finite` by ``one``, a
    1.0, which leaves every value as it was; else a test per tensor)."""
    if not tensors:
        return True
    got = scaled_finite(tensors, found, one)
    if got is not None:
        return got
    return all(bool(t.isfinite().all()) for t in tensors)


def _average_checked(b: Bucket, size: int, inv: float | None, scale: float = 1.0) -> bool:
    """Turn the bucket's sum over ``size`` ranks into their average (divided by fp16's
    loss ``scale`` too); whether it holds no NaN or infinity. One pass over the bucket
    where ``inv`` (1/size, exact) is given, two otherwise (the division, then the
    check), as were the division and the check before."""
    flat = b.flat
    if inv is None:
        flat.div_(size)
    # b.inv: 1/size, or 1 after the division, over the scale
    factor = (inv if inv is not None and size > 1 else 1.0) / scale
    got = scaled_finite([flat], b.found, b.inv)
    if got is not None:
        return got
    if factor != 1.0:
        flat.mul_(factor)
    # NaN and infinities survive a sum (one pass, no temporary); a finite sum that
    # overflows means gradients near 1e38, which are no better
    return math.isfinite(float(flat.sum()))


# optimizer state that is one value for all of a parameter's elements (Adam's step
# count); every other tensor in the states of SGD, Adam and AdamW is elementwise
_SCALAR_STATE = frozenset({"step"})


def _per_parameter(b: Bucket) -> dict[str, Any]:
    """The bucket optimizer's state_dict as if it optimized ``b.params`` one by one."""
    sd = b.optimizer.state_dict()
    flat = sd["state"].get(0)
    state = {}
    if flat:
        for i, (p, off) in enumerate(zip(b.params, b.offsets)):
            state[i] = {
                k: v[off : off + p.numel()].view_as(p)
                if isinstance(v, torch.Tensor) and k not in _SCALAR_STATE
                else v
                for k, v in flat.items()
            }
    groups = [{**g, "params": list(range(len(b.params)))} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def _flat_state(b: Bucket, per_param: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The flat optimizer's state from per-parameter ones (those of ``b.params``)."""
    if not any(per_param):
        return {}
    state: dict[str, Any] = {}
    for k, first in per_param[0].items():
        values = [s.get(k) for s in per_param]
        if isinstance(first, torch.Tensor) and k not in _SCALAR_STATE:
            for v, p, name in zip(values, b.params, b.names):
                if not isinstance(v, torch.Tensor) or v.shape != p.shape:
                    raise ValueError(
                        f"the checkpoint's optimizer state {k!r} of {name} does not have "
                        f"the parameter's shape {tuple(p.shape)}: resume with the same model"
                    )
            state[k] = torch.cat([v.reshape(-1) for v in values])
        else:
            state[k] = first
    return {0: state}


def _noop() -> None:
    return None


def step_seed(seed: int, rank: int, step: int) -> int:
    """A seed per (run, rank, step): dropout is reproducible across a resume without
    saving every rank's generator."""
    return (seed * 1_000_003 + rank * 10_007 + step) % (2**63 - 1)
