"""``train(config)``: one rank's whole run — data, model, step graph, checkpoints.

Every rank calls it with the same config; the backend says which rank it is. Rank 0
writes checkpoints and evaluates on the test set. A run that finds a valid checkpoint
in ``checkpoint_dir`` resumes from it exactly: same parameters, optimizer state, data
position and per-step random seeds as if it had never stopped.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dagtrain.config import TrainConfig
from dagtrain.errors import InputError
from dagtrain.rank_env import FIRST_COLLECTIVE, REGROW, STATUS_DIR, mark_ready, stopping
from dagtrain.records.names import CHECKPOINT, EPOCH_TRACE, LAST_TRACE
from dagtrain.records.result import TrainResult
from dagtrain.sync import Backend, get_backend

from . import checkpoint
from .allocator import keep_freed_memory
from .batches import to_device
from .data import Dataset, data_form, load_dataset, shard_batches
from .device import choose_device
from .models import bounded_model, construct
from .objective import checked_loss, objective_of
from .pipelining import StageStep
from .progress import Progress, RankStatus
from .protocol import TrainStep
from .recipe import EarlyStop, GradStats
from .rescue import Rescue, newest, remove_rescues
from .samples import loader
from .stages import build_stages, load_own, own_state
from .step import StepGraph
from .uncompiled import leave_compiler_unloaded
from .warmstart import initial_weights

__all__ = ["TrainResult", "train"]

log = logging.getLogger(__name__)


def _batches(
    ds: Dataset, cfg: TrainConfig, rank: int, world: int, start: int, workers: int = 0
) -> Iterator[tuple[int, int, tuple[torch.Tensor, torch.Tensor, int]]]:
    """(epoch, step in epoch, batch) for every step from global step ``start`` on: the
    position in the sample order is the step, so a resumed run reads what it would
    have. ``workers``: DataLoader worker processes reading a Dataset's items."""
    n, t = len(ds.train), cfg.training
    per_epoch = math.ceil(n / t.batch_size)
    steps: list[tuple[int, int, int]] = []

    def plan() -> Iterator[torch.Tensor]:
        for epoch in range(start // per_epoch, t.epochs):
            shares = shard_batches(n, t.batch_size, rank, world, t.seed, epoch)
            first = start - epoch * per_epoch if epoch == start // per_epoch else 0
            for k in range(first, len(shares)):
                idx, count = shares[k]
                steps.append((epoch, k, count))
                yield idx

    for x, y in loader(ds.train, plan(), workers):
        epoch, k, count = steps.pop(0)
        yield epoch, k, (x, y, count)


def train(cfg: TrainConfig, backend: Backend | None = None) -> TrainResult:
    """Run (or resume) training as one rank; returns this rank's TrainResult."""
    torch.set_num_threads(cfg.executor.intra_op_threads)
    leave_compiler_unloaded()  # (again in make_optimizer, after the model's factory)
    if cfg.executor.keep_freed_memory:
        keep_freed_memory()  # before the model and the data are built
    own = backend is None
    if backend is None:
        # before anything initialises CUDA: a GPU rank sees its own GPU only
        device = choose_device(cfg.distributed.device)
        backend = get_backend(
            cfg.distributed.backend, cfg.distributed.collective_timeout, device=str(device)
        )
    try:
        result = _train(cfg, backend)
    except BaseException as e:
        if cfg.distributed.elastic:  # a peer lost: save the last completed step first
            stopping(f"{type(e).__name__}: {e}")
        if own:
            backend.close(failed=True)
        raise
    if own:
        backend.close()
    return result


def _train(cfg: TrainConfig, backend: Backend) -> TrainResult:
    return RankRun(cfg, backend).run()


@dataclass
class Figures:
    """A rank's running figures, which a checkpoint and an elastic rescue carry.

    ``start``: the step this launch began at; ``summed``: the steps whose figures are in
    ``sums``; ``epochs``: the closed epochs' rows; ``sums``: this rank's sums of the
    epoch so far, as the objective names them (``sum_names``: the loss, its tallies, the
    units); ``carried``: the whole world's sums of the epoch before the checkpoint this
    launch resumed from."""

    sums: list[float]
    carried: list[float]
    start: int = 0
    summed: int = 0
    epochs: list[dict[str, Any]] = field(default_factory=list)
    # the epoch's LR and gradient norms so far (the same on every rank)
    grads: GradStats = field(default_factory=GradStats)


class RankRun:
    """One rank's run: the data, the model and its step (made here, every rank alike),
    then :meth:`run`, the loop over steps with its epochs' ends and checkpoints."""

    def __init__(self, cfg: TrainConfig, backend: Backend) -> None:
        self.cfg, self.backend = cfg, backend
        rank, world = backend.rank, backend.size
        if world != (cfg.world or cfg.distributed.ranks):
            raise InputError(
                f"this run has {world} rank(s) but distributed.ranks is "
                f"{cfg.distributed.ranks}{f' (world {cfg.world})' if cfg.world else ''}: "
                "start the ranks with dagtrain.training.run_training (or the launcher "
                "distributed.launcher names), as many as distributed.ranks"
            )
        self.objective = objective_of(cfg.objective)
        self.ds = _dataset(cfg)
        cfg.training.check_warmup(self.total)  # the run's steps are known with the data
        torch.manual_seed(cfg.training.seed)
        self.keys: set[str] | None = None  # a pipeline rank's state keys (its stage's)
        self.stage = 0  # a pipeline rank's stage, whose shard of each checkpoint it writes
        snap = self.snapshot if cfg.checkpoint_dir else None
        if cfg.parallel.stages > 1:
            # a stage's ranks of one replica read the same share of each batch
            n = min(len(self.ds.train), cfg.training.batch_size)
            first = self.ds.train.batch(torch.arange(n))[0]
            ds, spec = self.ds, cfg.model
            stages = build_stages(
                cfg, backend, lambda: construct(
                    spec.name, ds.in_shape, ds.classes, ds.info, **spec.args
                ), first,
            )  # fmt: skip
            self.model = stages.model  # its stage built, the others described (meta)
            self.keys, self.stage = set(stages.keys[stages.stage]), stages.stage
            initial_weights(cfg, self.model)  # training.init / init_from; scratch: as built
            self.sg: TrainStep = StageStep(cfg, stages, backend, first, snap, self.objective)
        else:
            self.model = bounded_model(cfg.model, self.ds.in_shape, self.ds.classes, self.ds.info)
            self.model.to(backend.device)
            self.check_objective()
            initial_weights(cfg, self.model)
            self.sg = StepGraph(cfg, self.model, backend, snap, self.objective)
        self.result = TrainResult(
            rank=rank, world=world, backend=backend.name, config=cfg.model_dump(mode="json")
        )
        # rank 0 writes the checkpoints; in a pipeline, each stage's first replica its
        # stage's shard of them too (a data-parallel rank is a replica of its own)
        self.writer = (
            ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
            if self.sg.replica == 0
            else None
        )
        self.pending: list[Future] = []  # this rank's checkpoint write in flight
        self.staged: list[dict[str, Any]] = []  # a snapshot not yet handed to the writer
        self.figures = Figures(sums=self.zeros(), carried=self.zeros())
        self.rescue: Rescue | None = None  # an elastic run's, once armed
        split = "val" if cfg.eval_data else "test"
        self.early = EarlyStop(cfg, dict(self.objective.metrics), split)
        self.best_state: dict[str, torch.Tensor] | None = None  # the best epoch's model
        self.stopped = False  # early stopping stopped the run

    def check_objective(self) -> None:
        """An author's objective's loss of the model's output on two training samples,
        checked before any step (:func:`.objective.checked_loss`): one that gives no
        scalar is refused naming ``objective.name``, not deep inside a step. Eval mode
        and the generators' state kept: the run draws what it would have without it."""
        if self.cfg.objective.builtin or not len(self.ds.train):
            return
        x, y = self.ds.train.batch(torch.arange(min(2, len(self.ds.train))))
        was = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                out = self.model(to_device(x, self.backend.device))
        finally:
            self.model.train(was)
        checked_loss(self.objective, out, to_device(y, out.device), self.cfg.objective.name)

    def zeros(self) -> list[float]:
        """The running sums at an epoch's start: the loss, the tallies, the units."""
        return [0.0, *(0,) * len(self.objective.tallies), 0]

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, step: int) -> None:
        """Copy the state after ``step`` steps; :meth:`commit` hands it to the writer.

        Inside the step graph it runs with ``in`` on every parameter: the next updates
        wait for this copy only, and the write goes on in the background. With
        ``checkpoint_write: inline`` nothing is copied: :meth:`commit`, which runs before
        the next step, writes the live state and waits."""
        if self.writer is None:
            return
        inline = self.cfg.training.checkpoint_write == "inline"
        model = {k: v.detach() for k, v in own_state(self.model).items()}
        optim = self.sg.optimizer_states()  # the live state
        self.staged.append(
            {
                "model": model if inline else {k: v.clone() for k, v in model.items()},
                "optim": optim if inline else copy.deepcopy(optim),  # tensors cloned
                "step": step,
                "epochs": json.dumps(self.figures.epochs),
                "precision": json.dumps(self.sg.precision.state()),
                "config": self.cfg.model_dump_json(),
            }
        )

    def commit(self) -> None:
        """Every rank: the epoch's running sums, summed over the ranks, go with the
        staged snapshot; rank 0 writes it (one write at a time: a failed write fails
        the run at the next commit or at the end), and in a pipeline each other
        stage's first replica its stage's shard, which rank 0's file lists."""
        f = self.figures
        summed = torch.tensor([float(v) for v in f.sums], dtype=torch.float64)
        self.backend.allreduce(summed, "checkpoint-sums")
        protect = self.best_step()  # (rank 0's rows hold the evaluation: its answer)
        if self.keys is not None:
            protect = self.backend.broadcast_object(protect)
        if self.writer is None:
            return
        snap = self.staged.pop()
        if self.stage > 0:  # a pipeline stage's shard: its own part alone
            snap = {k: snap[k] for k in ("model", "optim", "step")}
        else:
            if self.keys is not None:
                snap["shards"] = self.sg.shards(snap["step"])
            # the step's own gradient figures are in now (the snapshot ran inside the step)
            snap["grads"] = json.dumps(f.grads.state())
            totals = summed * self.backend.size + torch.tensor(f.carried, dtype=torch.float64)
            snap["sums"] = json.dumps(totals.tolist())
        for w in self.pending:
            w.result()
        # (checkpoint.save keeps a sharded checkpoint's older files: its writers run apart)
        args = (
            snap, self.cfg.checkpoint_dir, snap["step"], self.cfg.training.keep_checkpoints,
            protect, self.stage,
        )  # fmt: skip
        write = self.writer.submit(checkpoint.save, *args)
        if self.cfg.training.checkpoint_write == "inline":
            write.result()  # the live state: written before the next step changes it
        self.pending[:] = [write]

    def best_step(self, rows: list[dict[str, Any]] | None = None) -> int | None:
        """The step of the best epoch's checkpoint (early stopping keeps it whatever
        ``keep_checkpoints`` says) by ``rows`` (the closed epochs' rows, this run's by
        default); None without early stopping or a best epoch."""
        if not self.early.on:
            return None
        best, _, _ = self.early.best(self.figures.epochs if rows is None else rows)
        return None if best is None else min((best + 1) * self.per_epoch, self.total)

    def rescued(self) -> dict[str, Any] | None:
        """An elastic rank's state at its last completed step, copied (under
        ``sg.guard``, which the caller holds: see :mod:`.rescue`); None when it
        completed none since it started (its checkpoint already holds that step)."""
        sg, f = self.sg, self.figures
        step = sg.completed
        if step <= f.start:
            return None
        sums = [float(v) for v in f.sums]
        grads = GradStats.of(f.grads.state())
        if f.summed < step:  # the step's own figures, not added yet
            sums = [a + float(b) for a, b in zip(sums, sg.out)]
            grads.add(sg.norm, sg.factor, sg.lr)
        return {
            "model": {k: v.detach().clone() for k, v in own_state(self.model).items()},
            "optim": copy.deepcopy(sg.optimizer_states()),
            "step": step,
            "epochs": json.dumps(f.epochs),
            "grads": json.dumps(grads.state()),
            "precision": json.dumps(sg.precision.state()),
            "config": self.cfg.model_dump_json(),
            # this rank's own figures of the epoch, and the world's from before this
            # launch: the next world's rank 0 adds the survivors' up (rescue.newest)
            "sums": json.dumps(sums),
            "carried": json.dumps(f.carried),
        }

    def resume(self) -> int:
        """Load the newest valid checkpoint on every rank; return the step to start at.

        Rank 0 looks in ``checkpoint_dir`` and at the rescues an elastic run's survivors
        wrote (:mod:`.rescue`); a newer rescue becomes the run's checkpoint first."""
        cfg, backend = self.cfg, self.backend
        if not cfg.checkpoint_dir:
            return 0
        found = newest(cfg.checkpoint_dir, self.keys) if backend.rank == 0 else None
        if found is not None and found[0].parent != Path(cfg.checkpoint_dir):
            step = int(found[1]["step"])
            keep = cfg.training.keep_checkpoints
            protect = self.best_step(json.loads(found[1]["epochs"]))  # not rotated out
            saved = checkpoint.save(found[1], cfg.checkpoint_dir, step, keep, protect)
            log.info(
                "rank 0 takes the rescue of step %d (%s) as checkpoint %s", step, found[0], saved
            )
            found = (saved, found[1])
        path = backend.broadcast_object(str(found[0]) if found else None)
        if backend.rank == 0:
            remove_rescues(cfg.checkpoint_dir)  # older than the checkpoint, or saved as one
        if path is None:
            return 0
        snap = found[1] if found else checkpoint.load(path, self.keys)
        load_own(self.model, snap["model"], Path(path).name)
        self.sg.load_optimizer_states(snap["optim"])
        self.figures.epochs = json.loads(snap["epochs"])
        self.figures.grads = GradStats.of(json.loads(snap.get("grads", "null")))
        self.sg.precision.load(json.loads(snap.get("precision", "null")))
        # the whole world's figures of the epoch so far, on every rank (added once)
        self.figures.carried = [float(v) for v in json.loads(snap["sums"])]
        self.result.resumed_from_step = int(snap["step"])
        self.result.resumed_epochs = len(self.figures.epochs)
        written, now = snap.pop("stages", 1), cfg.parallel.stages
        log.info(
            "rank %d resumes from %s (step %d%s)",
            backend.rank,
            path,
            snap["step"],
            "" if written == now else f"; {_resharded(written, now)}",
        )
        return int(snap["step"])

    # ------------------------------------------------------------------ epochs
    def close_epoch(self, epoch: int) -> dict[str, Any]:
        """The epoch's row (the world's training figures, rank 0's evaluation), added
        to the closed epochs; the running figures start again."""
        cfg, backend, f = self.cfg, self.backend, self.figures
        t = torch.tensor([float(v) for v in f.sums], dtype=torch.float64)
        backend.allreduce(t, "epoch-metrics")
        t = t * backend.size + torch.tensor(f.carried, dtype=torch.float64)
        row = {"epoch": epoch, **self.objective.figures(t.tolist(), "train"), **f.grads.row()}
        if len(self.ds.test):  # rank 0's (a pipeline's: every rank's)
            split = "val" if cfg.eval_data else "test"
            row.update(self.sg.evaluate(self.ds.test, split))
        with self.sg.guard:  # a rescue sees the epoch closed, or its figures still running
            f.epochs.append(row)
            f.sums[:] = self.zeros()
            f.carried = self.zeros()
            f.grads = GradStats()
        log.info("epoch %d: %s", epoch, row)
        return row

    # ------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        cfg, backend, sg, f, result = self.cfg, self.backend, self.sg, self.figures, self.result
        t, rank = cfg.training, backend.rank
        try:
            if backend.size > 1:  # the launcher names a rank that never gets here
                mark_ready()  # in its status record, for the launcher
                print(f"dagtrain rank {rank} {FIRST_COLLECTIVE}", file=sys.stderr, flush=True)
            start = self.resume()
            if start == 0 and self.keys is None:
                backend.broadcast([p.data for p in self.model.state_dict().values()])
            elif start == 0 and getattr(sg, "group", None) is not None:
                # a stage's replicas start from its first replica's values (a factory
                # drawing from another generator than torch's would differ otherwise)
                sg.group.broadcast([v for v in own_state(self.model).values()])
            sg.step = sg.completed = f.summed = f.start = start
            per_epoch = self.per_epoch
            total = self.total
            sg.total = total  # the LR is a function of the step and of the run's steps
            if cfg.distributed.elastic and cfg.checkpoint_dir:
                # a pipeline rank's state is its stage's alone: it saves none (an elastic
                # pipeline's stages resume from the newest sharded checkpoint), and
                # still says, when made to stop, that it survived
                capture = self.rescued if self.keys is None else lambda: None
                self.rescue = Rescue(cfg.checkpoint_dir, rank, sg.guard, capture)
                self.rescue.arm()
            batches = _batches(self.ds, cfg, sg.replica, sg.replicas, start, cfg.data_workers)
            upcoming = next(batches, None)
            sg.fetch = lambda: next(batches, None)
            progress = Progress(cfg.metrics_file if rank == 0 else None, t.batch_size)
            progress.start(start, total, per_epoch, result.resumed_from_step)
            if start and len(f.epochs) < start // per_epoch:
                # a rescue at an epoch's last step, before the epoch was closed: close it
                progress.epoch(self.close_epoch(start // per_epoch - 1), start)
            if self.early.on and start < total and f.epochs:
                # a retry of a run that had already stopped early (its checkpoint is the
                # stop's) stops again at once, as rank 0 decides from its rows
                decided = self.early.decide(f.epochs)[1] if rank == 0 else None
                self.stopped = bool(backend.broadcast_object(decided))
            status = RankStatus(cfg.status_dir, rank, prompt=cfg.distributed.elastic)
            status.start(start, total, resumed_epochs=result.resumed_epochs, **sg.placement())
            while upcoming is not None and sg.step < total and not self.stopped:
                epoch, k, batch = upcoming
                last_in_epoch = k == per_epoch - 1
                want = self._checkpoints_after(sg.step, total, last_in_epoch)
                trace = _trace_file(cfg, rank, sg.step, total, last_in_epoch)
                if trace is not None and sg.step + 1 == total:
                    result.trace = trace
                t0 = time.perf_counter()
                # an epoch's last step checkpoints after the epoch's metrics are in
                out = sg.run(batch, snapshot=want and not last_in_epoch, trace=trace)
                with sg.guard:  # a rescue copies the figures with the step they count
                    for i, v in enumerate(out):
                        f.sums[i] += v
                    f.grads.add(sg.norm, sg.factor, sg.lr)
                    f.summed = sg.step
                status.step(time.perf_counter() - t0, len(batch[1]))
                regrow = stop = False
                if last_in_epoch:
                    progress.epoch(self.close_epoch(epoch), sg.step)
                    status.flush()
                    best, stop = self.early_decision()
                    stop = self.stopped = stop and sg.step < total
                    regrow = _regrow_asked(cfg, backend) and sg.step < total and not stop
                    # the best epoch's model is checkpointed (and kept), and the last one's
                    want = want or ((regrow or best or stop) and cfg.checkpoint_dir is not None)
                    if want:
                        self.snapshot(sg.step)
                if want:
                    self.commit()
                result.step_seconds.append(time.perf_counter() - t0)
                upcoming = sg.prefetched
                if regrow:  # the next epoch on more ranks: stop here, checkpointed
                    result.stopped_for = "regrow"
                    break
                if stop:  # early stopping: no better epoch for `patience` epochs
                    if trace is not None:  # this step was the run's last: its trace is
                        last = Path(trace).with_name(LAST_TRACE(rank=rank))  # the last's
                        os.replace(trace, last)
                        result.trace = str(last)
                    break
            self._finish(progress, status)
            return result
        finally:
            sg.close()
            if self.writer is not None:
                self.writer.shutdown(wait=True)

    def _checkpoints_after(self, step: int, total: int, last_in_epoch: bool) -> bool:
        """Whether the step after ``step`` steps is checkpointed: every
        ``checkpoint_every`` steps, else at each epoch's end, and at the last step."""
        every = self.cfg.training.checkpoint_every
        return self.cfg.checkpoint_dir is not None and bool(
            (every and (step + 1) % every == 0)
            or (not every and last_in_epoch)
            or step + 1 == total
        )

    @property
    def per_epoch(self) -> int:
        return math.ceil(len(self.ds.train) / self.cfg.training.batch_size)

    @property
    def total(self) -> int:
        """The run's steps: its epochs', or ``training.max_steps`` if fewer."""
        return self.cfg.training.steps(len(self.ds.train))

    def early_decision(self) -> tuple[bool, bool]:
        """At an epoch's end, every rank: (this epoch is the best so far, stop now), as
        rank 0 decides from its evaluation (``training.early_stopping``; without it,
        neither). The best epoch's model is kept in memory too, for the end."""
        if not self.early.on:
            return False, False
        decided = self.early.decide(self.figures.epochs) if self.backend.rank == 0 else None
        best, stop = self.backend.broadcast_object(decided)
        if best:
            self.best_state = {k: v.detach().clone() for k, v in own_state(self.model).items()}
        return best, stop

    def _restore_best(self) -> None:
        """Early stopping: the best epoch's model is the run's model at its end (the
        one the result's digest, checkpoint, evaluation and promotion see)."""
        if not self.early.on or self.result.stopped_for is not None:
            return
        rows = self.figures.epochs
        self.result.early_stop = self.early.record(rows, self.stopped)
        best, _, _ = self.early.best(rows)
        if best is None or best == len(rows) - 1:
            return
        step = self.best_step()
        state, kept = self.best_state, None
        if self.cfg.checkpoint_dir:
            kept = Path(self.cfg.checkpoint_dir) / CHECKPOINT(step=step)
            if state is None:  # the best epoch was before a resume: its checkpoint
                state = checkpoint.load(kept, self.keys)["model"]
        if state is not None:
            load_own(self.model, state, "the best epoch's state")
            if kept is not None and self.backend.rank == 0:
                self.result.checkpoint = str(kept)

    def digest(self) -> str:
        """The model's :func:`.checkpoint.state_digest` (all ranks call it): a
        pipeline's stages each digest their own tensors, and every rank combines them."""
        digests = checkpoint.tensor_digests(own_state(self.model))
        if self.keys is not None:
            replicas = self.backend.size // self.cfg.parallel.stages
            for s in range(self.cfg.parallel.stages):
                digests |= self.backend.broadcast_object(digests, root=s * replicas)
        return checkpoint.combine_digests(digests)

    def _finish(self, progress: Progress, status: RankStatus) -> None:
        sg, result = self.sg, self.result
        for w in self.pending:
            result.checkpoint = str(w.result())  # the newest write, rank 0
        self._restore_best()
        result.steps = sg.step
        result.skipped_steps = sg.skipped
        result.bucket_bytes = [b.flat.numel() * b.flat.element_size() for b in sg.buckets]
        result.epochs = self.figures.epochs
        result.pipeline = sg.describe()
        result.params_sha256 = self.digest()
        times = sorted(result.step_seconds)
        if times:
            result.samples_per_second = self.cfg.training.batch_size / times[len(times) // 2]
        if result.stopped_for is None:
            progress.end(sg.step, result.early_stop)
            status.done()
        else:  # the run goes on in the next world: not the end, and not done
            status.flush()


def _dataset(cfg: TrainConfig) -> Dataset:
    """The run's samples: its data split here (train and test), or, with ``eval_data``,
    both files already prepared (neither split nor normalised here)."""
    t = cfg.training
    form = data_form(cfg)
    if not cfg.eval_data:
        return load_dataset(cfg.data, cfg.test_fraction, t.seed, cfg.normalize, form)
    ds = load_dataset(cfg.data, 0.0, t.seed, False, form)
    held = load_dataset(cfg.eval_data, 0.0, t.seed, False, form)
    if held.in_shape != ds.in_shape:
        raise InputError(
            f"eval_data {cfg.eval_data!r} has samples of shape {held.in_shape}, "
            f"data {cfg.data!r} of shape {ds.in_shape}"
        )
    ds.test = held.train
    ds.classes = max(ds.classes, held.classes)
    return ds


def _regrow_asked(cfg: TrainConfig, backend: Backend) -> bool:
    """Whether the launching side asked this elastic run, which lost ranks, to stop at
    this epoch's end and start again on more (``REGROW`` in the job's status folder):
    rank 0 looks, every rank learns its answer."""
    d = cfg.distributed
    if not (d.elastic and d.regrow and (cfg.world or d.ranks) < d.ranks):
        return False
    folder = os.environ.get(STATUS_DIR)
    asked = backend.rank == 0 and folder is not None and (Path(folder) / REGROW).exists()
    return bool(backend.broadcast_object(asked))


# traced steps kept per rank besides the last: the newest epochs' last steps
TRACED_EPOCHS = 10


def _resharded(written: int, now: int) -> str:
    """How a resume's log line says a checkpoint of ``written`` pipeline stages (1:
    none) was read by a run of ``now``."""
    was = f"written by {written} pipeline stages" if written > 1 else "written without a pipeline"
    into = f"resharded onto {now} pipeline stages" if now > 1 else "merged (no pipeline)"
    return f"{was}, {into}"


def _trace_file(
    cfg: TrainConfig, rank: int, step: int, total: int, last_in_epoch: bool
) -> str | None:
    """Where step ``step``'s trace goes, if it is traced: the run's last step as
    ``step-rank<N>.json``, each epoch's last step as ``step<S>-rank<N>.json`` (S counted
    from 1; beyond TRACED_EPOCHS of those, the oldest is removed)."""
    if not (cfg.trace_dir and cfg.executor.trace) or not (last_in_epoch or step + 1 == total):
        return None
    d = Path(cfg.trace_dir)
    if step + 1 == total:
        return str(d / LAST_TRACE(rank=rank))
    mine = (f for f in d.glob("*") if (m := EPOCH_TRACE.match(f.name)) and m["rank"] == rank)
    older = sorted(mine)
    for f in older[: max(0, len(older) - (TRACED_EPOCHS - 1))]:
        f.unlink(missing_ok=True)
    return str(d / EPOCH_TRACE(step=step + 1, rank=rank))
