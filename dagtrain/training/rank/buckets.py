"""Gradient buckets: which parameters are averaged together, and the data-parallel
step's flat buckets.

The rule (DDP's) is :func:`bucket_groups`, the one both step kinds use: parameters in
backward's order (the reverse of the model's), the first bucket small so that its
allreduce starts early, the others up to ``bucket_mb``, one dtype and device each. The
data-parallel step's :class:`Bucket` also holds its parameters in one flat tensor; a
pipeline stage's :class:`StageBucket` only holds its gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dagtrain.taskgraph import Event

__all__ = [
    "COPY_NUMEL",
    "FIRST_BUCKET_MB",
    "Bucket",
    "StageBucket",
    "bucket_groups",
    "make_buckets",
    "stage_buckets",
]

# a gradient of this many elements or more is copied into its bucket by a hook, not
# added into the zeroed bucket by autograd (the 21M MLP's 2048x2048 weights; none of the
# residual CNN's, whose largest has 20,736)
COPY_NUMEL = 1 << 16

# DDP's rule: the first bucket (the last layers, whose gradients backward produces first)
# is small, so that its allreduce can start early; the others hold up to bucket_mb
FIRST_BUCKET_MB = 1.0


def bucket_groups(
    params: Sequence[torch.Tensor], bucket_mb: float, first_mb: float = FIRST_BUCKET_MB
) -> list[list[int]]:
    """The indices of ``params`` (in backward's order) by bucket: the first holds up to
    ``min(first_mb, bucket_mb)`` MB, the others up to ``bucket_mb``; a bucket holds one
    dtype on one device (one flat buffer). A parameter is never split, so one larger
    than its bucket's cap has a bucket of its own."""
    cap = max(1, int(min(first_mb, bucket_mb) * 2**20))
    groups: list[list[int]] = []
    size = 0
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        if groups:
            last = params[groups[-1][-1]]
            if size + nbytes > cap or (last.dtype, last.device) != (p.dtype, p.device):
                groups.append([])
                size = 0
                cap = max(1, int(bucket_mb * 2**20))
        else:
            groups.append([])
        groups[-1].append(i)
        size += nbytes
    return groups


class Bucket:
    """Parameters whose gradients are reduced together, in one flat buffer.

    The parameters live in one flat buffer too: each parameter's ``.data`` is a view
    into ``param`` (one tensor holding the bucket's parameters) and its ``.grad`` a view
    into ``flat``, which is ``param.grad``. The bucket's optimizer updates ``param``, so
    a step of SGD or Adam is a few kernels per bucket, not a few per parameter (the
    residual CNN's 29 parameters: 0.6 ms -> 0.33 ms a step). The update is elementwise,
    so it is the same, bit for bit, as the per-parameter one. ``model.to(...)`` after
    the buckets are made would undo the views: move the model first.
    """

    def __init__(self, index: int, params: list[tuple[str, nn.Parameter]]) -> None:
        self.index = index
        self.names = [n for n, _ in params]
        self.params = [p for _, p in params]
        numel = sum(p.numel() for p in self.params)
        dtype, device = self.params[0].dtype, self.params[0].device
        # on the parameters' device: a GPU model's gradients stay on its GPU
        self.flat = torch.zeros(numel, dtype=dtype, device=device)
        weights = torch.empty(numel, dtype=dtype, device=device)
        self.offsets: list[int] = []
        self.grads: list[torch.Tensor] = []  # each parameter's .grad, a view of flat
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                view = weights[offset : offset + n].view_as(p)
                view.copy_(p)
                p.data = view
                p.grad = self.flat[offset : offset + n].view_as(p)
                self.grads.append(p.grad)
                self.offsets.append(offset)
                offset += n
        self.param = nn.Parameter(weights)  # the same memory as the views
        self.param.grad = self.flat
        # gradients that backward hands over and a hook copies in (large ones), and
        # those autograd adds into their zeroed view (small ones: a Python hook per
        # parameter costs more than the pass it saves)
        self.copied = [i for i, p in enumerate(self.params) if p.numel() >= COPY_NUMEL]
        self.added = [i for i, p in enumerate(self.params) if p.numel() < COPY_NUMEL]
        self.event = Event()
        self.pending = len(self.params)
        self.optimizer: torch.optim.Optimizer | None = None
        # set by the pass that averages the bucket: 1.0 where it held NaN or infinity
        self.found = torch.zeros(1, dtype=torch.float32, device=device)
        self.inv = torch.ones(1, dtype=torch.float32, device=device)  # what it scales by
        self.finite = True


def make_buckets(
    model: nn.Module, bucket_mb: float, first_mb: float = FIRST_BUCKET_MB
) -> list[Bucket]:
    """The model's trainable parameters in :class:`Bucket` s, by :func:`bucket_groups`."""
    named = [(n, p) for n, p in reversed(list(model.named_parameters())) if p.requires_grad]
    groups = bucket_groups([p for _, p in named], bucket_mb, first_mb)
    return [Bucket(i, [named[j] for j in g]) for i, g in enumerate(groups)]


class StageBucket:
    """Consecutive parameters whose gradients a pipeline stage's replicas average
    together: a flat buffer, and each parameter's span of it (the parameters keep their
    own storage and autograd's gradients, copied in when final)."""

    def __init__(self, index: int, params: list[nn.Parameter]) -> None:
        self.index = index
        self.params = params
        self.spans, n = [], 0
        for q in params:
            self.spans.append((n, n + q.numel()))
            n += q.numel()
        self.flat = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        self.event: Event | None = None  # its allreduce task's, in the step running
        self.events: dict[str, Event] = {}  # that task's in each order's graph
        self.pending = len(params)  # gradients still to come in the step's last backward
        self.posted = False  # its average started this step


def stage_buckets(params: list[nn.Parameter], bucket_mb: float) -> list[StageBucket]:
    """``params`` (in backward's order) in buckets, by the data-parallel step's rule."""
    groups = bucket_groups(params, bucket_mb)
    return [StageBucket(i, [params[j] for j in g]) for i, g in enumerate(groups)]
