"""A pipeline-parallel step: one rank's stage as a TaskGraph, built once, replayed.

Ranks are stages x replicas, stage-major: rank ``s * D + d`` runs stage ``s`` of
replica ``d``. A replica's stages pass each microbatch's activation forward and its
gradient back; a stage's D replicas average their gradients. With ``parallel.chunks``
v > 1 the model is cut into S x v parts and stage s runs parts s, s + S, ... (its
chunks 0..v-1, looped), so a microbatch goes round the stages v times; with
``parallel.placement: v`` (v = 2) parts s and 2S - 1 - s (a V: down the ranks and back
up, the loss on stage 0). Where a rank holds the next part too (a V's turn, on stage
S - 1), the activation and its gradient are values of its graph, not transfers. On the
rank of stage s, for each microbatch m of the step and each of its chunks j (part c)::

    recv-act{m}.{j} ─ F{m}.{j} ─ send-act{m}.{j}        (from part c-1 / to c+1)
    recv-grad{m}.{j} ─ B{m}.{j} ─ send-grad{m}.{j}      (from part c+1 / to c-1)
                         └─ (W{m}.{j}) ─ ... ─ allreduce[k] ─ update[k]

(with one chunk the names have no ``.{j}``: ``F3``). ``F`` is the forward (on the last
part, with the loss), ``B`` the backward: the input gradient alone where the order
splits it (zero-bubble's cooldown: ``W`` then computes the weight gradient, from the
intermediates ``B`` kept), else the whole backward. The first part has no input
gradient to send, so its backward is one task. Sends and receives are detached tasks:
their body posts the transfer (``isend``/``irecv`` on gloo or nccl, ``Isend``/``Irecv``
under mpirun) and the transfer's completion, awaited with a deadline by a thread per
direction and chunk, completes them; where all of a rank's receives come one way (the
first and last stages, one chunk, not NCCL), the stage's own thread waits for them when
it has nothing else to start (one wake-up per hop, not two: :mod:`.transfers`). Every
transfer has a tag of its own (the part it goes into, its way, its microbatch), so a
send matches its receive whatever order the two ranks post them in (NCCL ignores tags:
chunks are refused there).

The orders are not tables. They are priorities among ready tasks and a token that
bounds how many of a rank's forwards are alive: a forward waits for the task that
frees the activations of the forward T places before it in the order's sequence, and
the receive that feeds it for the one T + 1 places before (posted before its peer's
send: gloo's rendezvous then lets the sender write at once, where a receive posted
after the send waits in the call for the sender's progress thread, 2-5 ms on a busy
core; one more input buffer a rank; not on NCCL, whose transfers between two ranks
queue on one stream), a chunk's receives in order:

============  =========================  ============================================
order         priorities (first first)   T (forwards alive on stage s)
============  =========================  ============================================
gpipe         F, B                       M x v
1f1b          B, F; with chunks          S - s; with chunks 2(S - s - 1) + (v-1)S + 1
              Megatron-LM's sequence
zero-bubble   as 1f1b, W last            as 1f1b (W frees a split one)
on a V        1f1b, zero-bubble: ZBV's   the most alive in ZBV's sequence
              sequence (torch's)
============  =========================  ============================================

zero-bubble splits only the backwards after the rank's last forward in its sequence
(its cooldown, where the stages after it still run theirs: W fills that wait); every
other backward is whole, since a split one costs far more on CPU (torch's split walks
the autograd graph in Python) and the steady state has no bubble for W to fill.

Transfers go before any compute. Activations are values of the graph: ``F``'s result
is dropped as its last reader (the send and ``B``, or ``W``) ends. Each chunk's weight
gradients accumulate in microbatch order (its ``W`` tasks, or fused backwards, are
chained), so a step is deterministic.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from dagtrain.config import TrainConfig
from dagtrain.config.schema import CHUNKS_ON_NCCL
from dagtrain.errors import InputError
from dagtrain.records.trace import bubble
from dagtrain.sync import Backend
from dagtrain.taskgraph import Event, TraceFile

from .activations import ActivationBytes
from .batches import cut, length, to_device
from .buckets import StageBucket, stage_buckets
from .objective import Objective, objective_of
from .optimizers import make_optimizer
from .order_trial import OrderTrial
from .recipe import Precision, clip_factor, lr_at
from .split import blocks_of, boundary_shapes
from .split_backward import input_grad, weight_grads
from .stage_graph import StageGraph
from .stage_state import StageState
from .stages import Stages, evaluate
from .step import NonFiniteGradients, all_finite, scaled_loss, step_seed
from .transfers import Transfers

__all__ = ["StageStep"]

# seconds: how soon a thread waiting for the GIL gets it from one running Python
SWITCH_INTERVAL = 0.0005


class StageStep(StageGraph, StageState):
    """One rank's pipeline step (a :class:`~.protocol.TrainStep`):
    ``run(batch, snapshot, trace)`` -> the objective's sums (the last part's rank's).

    A rank holds its stage's blocks alone (:mod:`.stages`: the other stages' tensors
    are on the meta device) — with ``parallel.chunks`` v > 1, its v parts of the model
    (parts s, s + S, ...; in a V, s and 2S - 1 - s); it evaluates as a pipeline
    (:meth:`evaluate`), and its checkpoint is its stage's shard
    (:meth:`optimizer_states`, :meth:`shards`).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        stages: Stages,
        backend: Backend,
        sample: torch.Tensor,
        snapshot: Callable[..., None] | None = None,
        objective: Objective | None = None,
    ) -> None:
        p = cfg.parallel
        self.objective = objective or objective_of(cfg.objective)
        model = stages.model
        self.cfg, self.model, self.backend = cfg, model, backend
        self.S, self.M = p.stages, p.microbatches
        self.D = backend.size // self.S
        self.stage, self.replica = divmod(backend.rank, self.D)  # rank = stage * D + replica
        self.replicas = self.D
        blocks = blocks_of(model)
        self.split, self.keys = stages.split, stages.keys
        # the parts of the model this rank runs (its chunks), in the order a sample
        # passes them; V parts in all
        self.v, self.V = self.split.chunks, len(self.split.ranges)
        self.parts = self.split.parts_of(self.stage)
        # the rank with the last part (the loss: stage S - 1, or in a V stage 0)
        self.last = self.V - 1 in self.parts
        self.modules = [nn.Sequential(*blocks[slice(*self.split.ranges[c])]) for c in self.parts]
        self.module = nn.Sequential(*self.modules)
        first = next(self.module.parameters(), None)
        self.device = first.device if first is not None else torch.device(backend.device)
        nccl = cfg.distributed.backend == "torch" and self.device.type == "cuda"
        if self.v > 1 and nccl:
            raise InputError(CHUNKS_ON_NCCL.format(chunks=self.v))  # (device: auto)
        self.early_receives = not nccl
        described = blocks_of(stages.meta)  # the boundaries' shapes, from the description
        one = to_device(cut(sample, 0, 1), torch.device("meta"))
        self.shapes = boundary_shapes(stages.meta, described, self.split, one)
        # the global order of the trainable parameters (the data-parallel step's bucket
        # order: reversed), which the checkpoint's optimizer state follows
        self.global_params = [q for _, q in reversed(list(model.named_parameters()))]
        self.global_params = [q for q in self.global_params if q.requires_grad]
        self.index = {id(q): i for i, q in enumerate(self.global_params)}
        # this stage's parameters, in that order. Their gradients are autograd's own (the
        # first microbatch's taken as is, the others added in: no zeroed buffer to add
        # into, as torch's schedules do); a stage with replicas copies them into flat
        # buckets to average them, which then hold them
        mine = {id(q) for q in self.module.parameters()}
        self.params = [q for q in self.global_params if id(q) in mine]
        names = {id(q): n for n, q in model.named_parameters()}
        self.names = [names[id(q)] for q in self.params]
        self.optimizer = make_optimizer(cfg, self.params) if self.params else None
        self._counted = False  # a step has counted its saved activations
        self._final = False  # in the step's last backward: gradients are final as they come
        self._final_m = -1
        self.buckets = (
            stage_buckets(self.params, cfg.distributed.bucket_mb) if backend.size > self.S else []
        )
        self._hooks = [
            q.register_post_accumulate_grad_hook(self._hook(bk))
            for bk in self.buckets
            for q in bk.params
        ]
        # every rank takes part in creating every stage's replica group
        self.group = (
            backend.subgroups([[s * self.D + d for d in range(self.D)] for s in range(self.S)])
            if self.D > 1
            else None
        )
        # a transfer's waiting thread takes the GIL to complete its task: within 0.5 ms
        # of the transfer, not the default 5 ms switch interval (the stage may be running
        # Python between kernels then), which is on the pipeline's critical path; the
        # process's own interval is back once the step is closed
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL))
        t = cfg.distributed.collective_timeout
        # a waiter per direction and chunk: a chunk's transfers of one way complete in
        # the order they were posted, the chunks' do not (chunk 1's gradient comes first)
        ways = [
            (k, j)
            for j, c in enumerate(self.parts)
            for k, needed in (
                ("recv-act", self.remote(c, c - 1)),
                ("send-act", self.remote(c, c + 1)),
                ("recv-grad", self.remote(c, c + 1)),
                ("send-grad", self.remote(c, c - 1)),
            )
            if needed
        ]
        # where every receive of the rank comes one way (the first stage's gradients,
        # the last's activations: one chunk), the stage's thread waits for them itself
        # when it has nothing to start: nothing it could start comes before the oldest
        # of them (a send's end readies nothing, the gradients' average the check,
        # after every receive), and it then wakes once per hop, not once in a waiting
        # thread and once more when that one wakes it. Not on NCCL, whose wait only
        # orders the current stream.
        recvs = [w for w in ways if w[0].startswith("recv")]
        own = len(recvs) == 1 and self.v == 1 and not nccl
        # with chunks, no thread waits for a send: a rank's 3 waiting threads of sends
        # woke about 12 times a step, each wake-up taking a core from a stage's thread
        # (the causal LM's 1f1b-v2: 0.95x torch's against 0.98x so, in focused runs).
        # Every send of a step is waited for once its last task is done, as torch's
        # multi-stage schedules do (their runtime waits for its sends at the step's
        # end): nothing in the step waits for a send, and nothing the peers need of
        # this step is left to post then. The sent tensors live until that end
        self._sends = (
            Transfers("pipeline-sends", backend.rank, t, thread=False) if self.v > 1 else None
        )
        self._waiters = {
            (k, j): Transfers(
                f"pipeline-{k}" + (f".{j}" if self.v > 1 else ""),
                backend.rank,
                t,
                thread=not (own and k.startswith("recv")),
            )
            for k, j in ways
            if self._sends is None or k.startswith("recv")
        }
        self._idle = self._waiters[recvs[0]].wait_next if own else None
        if self.D > 1:
            self._waiters["allreduce", 0] = Transfers("pipeline-allreduce", backend.rank, t)
        self.none = (0.0,) * len(self.objective.sum_names)
        self.step = 0
        self.completed = 0  # as StepGraph's (a pipeline rank rescues nothing)
        self.guard = threading.Lock()
        self.skipped = 0
        self.out = self.none
        self.fetch: Callable[[], Any] = lambda: None
        self.prefetched = None
        self.snapshot = snapshot
        self.want_snapshot = False
        self.finite = True
        # the finite check's flag and its factor, 1 (see step.all_finite)
        self._found = torch.zeros(1, dtype=torch.float32, device=self.device)
        self._one = torch.ones(1, dtype=torch.float32, device=self.device)
        self.activations = ActivationBytes(model)  # alive now, and the most in any step
        self.bubble: float | None = None
        # the recipe (see .recipe): the LR of the global step, autocast, and the
        # whole model's gradient norm, combined over the stages before any update
        self.total = 1
        self.precision = Precision(cfg, self.device)
        self.lr: float | None = None
        self.norm: float | None = None
        self.factor = 1.0
        # the order: the one asked for, or (auto) each candidate's graph, measured on
        # the first steps (:class:`.order_trial.OrderTrial`)
        self.trial = OrderTrial(backend) if p.order == "auto" else None
        candidates = self.trial.candidates if self.trial is not None else (p.order,)
        self.graphs = {o: self._build(o) for o in candidates}
        self.order = candidates[0]
        self.graph = self.graphs[self.order]

    # ------------------------------------------------------------------ tasks
    def _load_next(self) -> None:
        self.prefetched = self.fetch()

    def _zero_grads(self) -> None:
        for q in self.params:
            q.grad = None

    def _mb(self, m: int) -> tuple[int, int]:
        """Microbatch ``m``'s rows of this step's batch: (start, stop)."""
        return self.cuts[m], self.cuts[m + 1]

    def remote(self, part: int, other: int) -> bool:
        """Whether part ``other`` (next to ``part``) exists and is on another rank: a
        transfer; the next part on this rank (a V's turn) is handed over in memory."""
        return 0 <= other < self.V and self.split.stage_of(other) != self.stage

    def rank_of(self, part: int) -> int:
        """The rank of this replica that runs part ``part``."""
        return self.split.stage_of(part) * self.D + self.replica

    def where(self, part: int) -> str:
        """``stage s`` (and its chunk, where a rank holds several) of part ``part``."""
        return self.split.label(part)

    def tag(self, part: int, carries: str, m: int) -> int:
        """The tag of microbatch ``m``'s transfer into part ``part`` (``act``: from the
        part before, ``grad``: from the one after); one per part, way and microbatch,
        below :attr:`free_tag`."""
        return part * 2 * self.M + (self.M if carries == "grad" else 0) + m

    @property
    def free_tag(self) -> int:
        """The first tag no training step uses (the evaluation's are above it)."""
        return 2 * self.M * self.V

    def _post(self, way: str, m: int, j: int, t: torch.Tensor, event: Event) -> None:
        """Start microbatch ``m``'s transfer of chunk ``j`` (``way``: ``recv-act``,
        ``send-act``, ``recv-grad`` or ``send-grad``) of ``t``; the thread of that way
        and chunk waits for it and fulfils ``event``."""
        send, act = way.startswith("send"), way.endswith("act")
        c = self.parts[j]
        other = c - 1 if act != send else c + 1  # the part at the other end
        peer = self.rank_of(other)
        what = (
            f"rank {self.backend.rank} ({self.where(c)}): "
            f"{'sending' if send else 'receiving'} microbatch {m}'s "
            f"{'activation' if act else 'gradient'} {'to' if send else 'from'} rank {peer} "
            f"({self.where(other)})"
        )
        tag = self.tag(other if send else c, "act" if act else "grad", m)
        post = self.backend.send_async if send else self.backend.recv_async
        h = post(t, peer, tag, what)
        if send and self._sends is not None:  # (waited for at the step's end)
            self._sends.post(h, None, t)
            event.fulfill()
            return
        self._waiters[way, j].post(h, event, t)

    def _recv(self, way: str, m: int, j: int, event: Event) -> torch.Tensor:
        """A buffer for microbatch ``m``'s activation (``recv-act``: the output of the
        part before) or gradient (``recv-grad``: of this part's output), posted."""
        a, b = self._mb(m)
        c = self.parts[j]
        shape, dtype = self.shapes[c - 1 if way == "recv-act" else c]
        buf = torch.empty((b - a, *shape), dtype=dtype, device=self.device)
        if b == a:
            event.fulfill()
        else:
            self._post(way, m, j, buf, event)
        return buf

    def _recv_act(self, m: int, j: int, event: Event) -> torch.Tensor:
        return self._recv("recv-act", m, j, event)

    def _recv_grad(self, m: int, j: int, event: Event) -> torch.Tensor:
        return self._recv("recv-grad", m, j, event)

    def _send_act(self, m: int, j: int, act: tuple, event: Event) -> None:
        # an empty microbatch (a short last batch): nothing to send
        out = None if act[1] is None else act[1].detach().contiguous()
        if out is None or not len(out):
            event.fulfill()
        else:
            self._post("send-act", m, j, out, event)

    def _send_grad(self, m: int, j: int, dx: torch.Tensor | None, event: Event) -> None:
        if dx is None or not len(dx):
            event.fulfill()
        else:
            self._post("send-grad", m, j, dx.contiguous(), event)

    def _forward(self, m: int, j: int, inp: torch.Tensor | tuple | None) -> tuple:
        a, b = self._mb(m)
        c = self.parts[j]
        if c == 0:
            inp = cut(self.x, a, b)
            if self.device.type != "cpu":
                inp = to_device(inp, self.device)
        elif isinstance(inp, tuple):  # the part before is this rank's (a V's turn):
            inp = inp[1]  # its output, cut from its graph as a transfer would
            if inp is None:
                return (None, None, 0)
            inp = inp.detach().requires_grad_(inp.is_floating_point())
        else:
            inp.requires_grad_(inp.is_floating_point())
        if b == a:
            return (inp, None, 0)
        torch.default_generator.manual_seed(
            step_seed(
                self.cfg.training.seed, self.backend.rank, (self.step * self.M + m) * self.v + j
            )
        )
        # counted on the first step and the traced ones (a Python call per saved tensor
        # is ~5% of a small transformer's step): the peak of the steps it shows
        seen, hooks = self.activations.counting() if self._counting else ({}, nullcontext())
        with hooks, self.precision.autocast():
            out = self.modules[j](inp)
            if c == self.V - 1:
                y = to_device(cut(self.y, a, b), out.device)
                out, sums = scaled_loss(self.objective, out, y, self.count, self.D)
                for i, v in enumerate(sums):
                    self.sums[i] += v
            elif out.dtype != self.shapes[c][1]:  # autocast's: as the next receives
                out = out.to(self.shapes[c][1])
        return (inp, out, self.activations.held(seen))

    def _backward(self, m: int, j: int, act: tuple, dout: torch.Tensor | None) -> Any:
        inp, out, nbytes = act
        if out is None:
            return None
        c = self.parts[j]
        if out.requires_grad:  # (not where the part has no parameters and no input grad)
            self._final = m == self._final_m and bool(self.buckets)
            try:
                torch.autograd.backward(out, None if c == self.V - 1 else dout)
            finally:
                self._final = False
        self.activations.freed(nbytes)
        return None if c == 0 else inp.grad

    def _backward_input(self, m: int, j: int, act: tuple, dout: torch.Tensor | None) -> Any:
        inp, out, nbytes = act
        if out is None:
            return None
        last = self.parts[j] == self.V - 1
        dx, pending = input_grad(out, None if last else dout, inp, self.modules[j].parameters())
        self._pending_w[m, j] = (pending, nbytes)
        return dx

    def _backward_weight(self, m: int, j: int, dx: Any) -> None:
        got = self._pending_w.pop((m, j), None)
        if got is None:
            return
        pending, nbytes = got
        weight_grads(self.modules[j].parameters(), pending)
        self.activations.freed(nbytes)

    def _hook(self, bk: StageBucket) -> Callable[[torch.Tensor], None]:
        """A parameter's gradient is in: in the step's last backward, the bucket's last
        one starts the bucket's average while backward goes on with the layers before."""

        def fire(_: torch.Tensor) -> None:
            if self._final:
                bk.pending -= 1
                if bk.pending == 0:
                    self._post_allreduce(bk)

        return fire

    def _allreduce(self, bk: StageBucket, event: Event) -> None:
        # (the step's last backward started it where every gradient of the bucket came)
        if not bk.posted:
            self._post_allreduce(bk)

    def _post_allreduce(self, bk: StageBucket) -> None:
        bk.posted = True
        what = (
            f"rank {self.backend.rank} (stage {self.stage}): averaging gradient bucket "
            f"{bk.index} over the stage's {self.D} replicas"
        )
        for q, (a, b) in zip(bk.params, bk.spans):  # into the bucket, which then holds it
            view = bk.flat[a:b]
            if q.grad is None:
                view.zero_()
            else:
                view.copy_(q.grad.reshape(-1))
            q.grad = view.view_as(q)
        h = self.group.allreduce_async(bk.flat, what, average=True)
        self._waiters["allreduce", 0].post(h, bk.event, None)

    def _check(self) -> None:
        grads = [q.grad for q in self.params if q.grad is not None]
        max_norm = self.cfg.training.max_grad_norm
        norms: list[torch.Tensor] = []
        if max_norm is None:  # one call over every gradient (on the step's tail)
            self.finite = all_finite(grads, self._found, self._one)
        else:  # the norms clipping needs: a NaN or infinity makes its norm so (and a
            # norm past float32's range, which clipping could not use either)
            norms = torch._foreach_norm(grads) if grads else []
            # one read of the norms (not one per parameter: a transformer stage has ~100)
            self.finite = not grads or bool(torch.isfinite(torch.stack(norms)).all())
        if not self.finite and self.cfg.training.nonfinite == "fail":
            # the parameters to name (the rare path: a read of each gradient; the norms
            # skip the same missing gradients)
            named = [(n, q.grad) for n, q in zip(self.names, self.params) if q.grad is not None]
            bad = (
                [n for (n, _), v in zip(named, norms) if not v.isfinite()]
                if norms
                else [n for n, g in named if not bool(g.isfinite().all())]
            )
            raise NonFiniteGradients(self.step, self.stage, bad, "stage")
        if self.cfg.training.nonfinite == "skip" or max_norm is not None:
            # one small collective over every rank: the non-finite flag, and each
            # stage's sum of squares of its (averaged: the same on every replica, so the
            # first replica's alone) gradient, added into the whole model's
            mine = sum(float(v) ** 2 for v in norms) if self.replica == 0 and self.finite else 0.0
            got = torch.tensor([0.0 if self.finite else 1.0, mine], dtype=torch.float64)
            self.backend.allreduce(got, "gradient norm", average=False)
            self.finite = not got[0].item()
            if not self.finite:
                self.skipped += 1
            elif max_norm is not None:
                self.norm = float(got[1].item()) ** 0.5
                self.factor = clip_factor(self.norm, max_norm)
                if self.factor < 1.0 and grads:
                    torch._foreach_mul_(grads, self.factor)

    def _update(self) -> None:
        if self.finite and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
            self.optimizer.step()

    # ------------------------------------------------------------------ driving
    def run(
        self,
        batch: tuple[torch.Tensor, torch.Tensor, int],
        snapshot: bool = False,
        trace: str | None = None,
    ) -> tuple[float, ...]:
        """Run one step on ``batch`` (this replica's share of the global batch); the
        rank with the last part returns its sums (as the data-parallel step's), the
        others zeros."""
        self.x, self.y, self.count = batch
        n = length(self.y)
        sizes = [len(c) for c in torch.tensor_split(torch.arange(n), self.M)]
        self.cuts = [0]
        for k in sizes:
            self.cuts.append(self.cuts[-1] + k)
        self.sums = [0.0, *(0,) * (len(self.none) - 1)]
        self._pending_w: dict[tuple[int, int], Any] = {}
        self.lr = lr_at(self.cfg.training, self.step, self.total)
        self.norm, self.factor = None, 1.0
        self._counting = trace is not None or not self._counted
        self._counted = True
        self._final_m = max((m for m in range(self.M) if sizes[m]), default=-1)
        if self.trial is not None:
            self.order = self.trial.next()
            self.graph = self.graphs[self.order]
        for bk in self.buckets:
            bk.pending, bk.posted = len(bk.params), False
            bk.event = bk.events.get(self.order)
        self.activations.live = 0
        if self._sends is not None:
            self._sends.close()  # (a failed step's: never waited for)
        if not self.model.training:
            self.model.train()
        rank = self.backend.rank
        t0 = time.perf_counter()
        self.graph.run(
            workers=1,
            trace=None
            if trace is None
            else TraceFile(trace, rank, f"rank {rank} · stage {self.stage}"),
            timeout=self.cfg.distributed.collective_timeout * (2 * self.M * self.v + 4),
            idle=self._idle,
        )
        if self._sends is not None:
            self._sends.drain()
        if self.trial is not None:  # (a traced step counts activations: not timed)
            self.trial.done(self.order, time.perf_counter() - t0, timed=trace is None)
        if trace is not None:
            self.bubble = self._bubble()
        self.step += 1
        if snapshot and self.snapshot is not None:
            self.snapshot(self.step)
        return tuple(self.sums) if self.last else self.none

    def _bubble(self) -> float | None:
        """The last run's bubble (:func:`dagtrain.records.trace.bubble`)."""
        got = bubble((t.name, t.t0, t.t1) for t in self.graph.tasks if t.t1 > 0)
        return None if got is None else got[0]

    # ------------------------------------------------------------------ state
    # The checkpoint's optimizer state has the data-parallel step's format: per
    # parameter, indexed in reversed ``named_parameters`` order (the order backward
    # fills the buckets in), whatever the buckets or the split; a stage's shard holds
    # its parameters' entries, so a checkpoint resumes on any number of stages or
    # without a pipeline once its shards are merged (:func:`.checkpoint.load`).
    def evaluate(self, samples: Any, split: str) -> dict[str, float]:
        """The split's metrics, evaluated as a pipeline; on every rank (all call it)."""
        return evaluate(self, samples, split)

    def placement(self) -> dict[str, int]:
        return {"stage": self.stage, "replica": self.replica}

    def describe(self) -> dict[str, Any]:
        """What the result and the page show of this rank's pipeline."""
        return {
            "stages": self.S,
            "replicas": self.D,
            "microbatches": self.M,
            "order": self.order if self.trial is None else self.trial.kept,
            "order_trial": self.trial.describe() if self.trial is not None else None,
            "chunks": self.v,
            "placement": self.split.placement,
            "parts": self.parts,
            "split": self.split.bounds,
            "blocks": self.split.blocks,
            "ranges": self.split.ranges,
            "how": self.split.how,
            "stage_costs": [round(x * 1e3, 4) for x in self.split.stage_seconds],
            "stage": self.stage,
            "replica": self.replica,
            "peak_activation_bytes": self.activations.peak,
            "bubble": self.bubble,
            # what this rank holds of the model (the others' tensors are only described)
            "held_parameters": sum(q.numel() for q in self.params),
            "parameters": sum(q.numel() for q in self.global_params),
        }

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        for w in [*self._waiters.values(), *([self._sends] if self._sends else [])]:
            w.close()
        sys.setswitchinterval(self._switch_interval)
