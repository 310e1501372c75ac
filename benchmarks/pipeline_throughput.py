"""Pipeline-parallel throughput: dagtrain's orders against torch.distributed.pipelining's
schedules, in one run.

    .venv/bin/python benchmarks/pipeline_throughput.py [--rounds 3] [--steps 8] [--quick]

Same model, same blocks and split, same microbatches and global batch (64 samples, 4
microbatches), 2 ranks on CPU over gloo, one intra-op thread per rank. Models: the MLP
and the transformer classifier on digits, and ``causal-lm``: the built-in transformer
as a causal language model (``objective: language_model``; dim 128, 4 heads, 4 layers:
6 blocks, embedding, 4 attention blocks, head) on the windows of 64 bytes of
dags/data/corpus.txt, 4,096 tokens a step:

  dagtrain gpipe / 1f1b / zero-bubble   ``parallel.order`` of dagtrain's pipeline step
                      (``parallel: {stages: 2, microbatches: 4, split: [k]}``),
                      each rank calling ``dagtrain.training.train`` with the config
  dagtrain <order>-v2 the same order with ``parallel.chunks: 2`` on the 4-piece split
                      (looped: rank 0 holds pieces 0 and 2, rank 1 pieces 1 and 3, as
                      torch's looped classes): gpipe-v2 is looped BFS, 1f1b-v2
                      interleaved 1F1B, zero-bubble-v2 interleaved zero-bubble
  dagtrain <order>-V  two chunks in a V (``parallel.placement: v``, the same 4 pieces:
                      rank 0 holds pieces 0 and 3, rank 1 pieces 1 and 2, as torch's
                      V-shaped classes): zero-bubble-V is ZBV's sequence (torch's
                      ScheduleZBVZeroBubble), 1f1b-V the same with each backward whole,
                      gpipe-V every forward first
  torch <Schedule>    torch.distributed.pipelining: ``PipelineStage`` of
                      ``nn.Sequential(*blocks[a:b])``, the schedule class, SGD after
                      each ``step()``; ScheduleGPipe and Schedule1F1B on the same 2
                      stages; the multi-stage classes on 4 stages, 2 per rank (looped:
                      stages 0,2 and 1,3; V-shaped: 0,3 and 1,2)

Both sides build their blocks from the same seed (``dagtrain.training.rank.split.blocks_of``
of the built-in model, on the data's ``DataInfo``), optimise the same loss (cross-entropy
summed over a microbatch's samples, or its tokens for the language model, divided by the
global batch's samples or tokens: dagtrain's ``scaled_loss``), with SGD (lr 0.01,
momentum 0.9), and time the same thing:
a step from its batch to its update. Rounds interleave the systems (each system a block
of steps per round, each dagtrain order next to torch's schedule of the same family, in
an order rotated each round) so that a slow spell of this shared machine hits them
alike; each ratio is also given round by round (``ratios.rounds``), which says what it
can be trusted to.

Per system: samples/s (global batch / the median of all timed steps, each step the
slower of the two ranks'; and from the fastest tenth of them, what a system does in the
quiet spells of a shared machine, with ratios of its own), the bubble (dagtrain: from
its step traces, the share of a rank's step with no F/B/W task running; torch: measured
the same way, from timers around the stage's forward/backward/weight-gradient calls, and
for GPipe/1F1B the formula (p-1)/(m+p-1)), and peak activation bytes per rank (torch:
the live bytes of the tensors autograd saved, counted by
``torch.autograd.graph.saved_tensors_hooks`` during one extra, untimed step; dagtrain
reports its own, and a job of its own per order counts dagtrain's the torch way over a
few untimed steps, with what is still alive after them). dagtrain's traced step (the
trace behind its bubble; it counts its activations too) is likewise one extra, untimed
step: timed, it was the slowest or nearly of each job, 8-13% over the median of the
transformer's 1f1b in three jobs. A torch schedule that fails is recorded with its
error. About 10 minutes a model here (half of it starting 2-rank jobs):
5 rounds of 12 timed steps, since with 3 of 8 a system's figure moved by 5-15% from one
run to the next on these 2 shared cores, as much as the differences measured; the
committed run has ``--rounds 10``, for ratios a run can trust to a few per cent.
Writes benchmarks/results/pipeline_throughput.json; with ``--models`` naming only some,
their entries replace those of the file and the others' are kept (each entry says when
it was measured).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._results import out_help, results_path  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    # train_throughput.py's MLP: 21M parameters, six hidden layers of 2048
    "mlp-21M": {"model": "mlp", "model_args": {"hidden": [2048] * 6}},
    # rows of the 8x8 digit are the tokens: embedding, 8 encoder layers, pooling head
    "transformer": {
        "model": "transformer",
        "model_args": {"layers": 8, "dim": 128, "heads": 4},
    },
    # next-byte prediction on a text: token embedding, 4 causal attention blocks, head
    "causal-lm": {
        "model": "transformer",
        "model_args": {"layers": 4, "dim": 128, "heads": 4},
        "objective": "language_model",
        "data": str(HERE.parent / "dags" / "data" / "corpus.txt"),
        "sequence_length": 64,
    },
}
NPROCS = 2
BATCH = 64
MICROBATCHES = 4
WARMUP = 2
DATA = "digits"
TEST_FRACTION = 0.2  # dagtrain's default; the torch side cuts its batches the same way
LR, MOMENTUM = 0.01, 0.9
ORDERS = [
    *("gpipe", "1f1b", "zero-bubble"),
    *("gpipe-v2", "1f1b-v2", "zero-bubble-v2"),
    *("gpipe-V", "1f1b-V", "zero-bubble-V"),
]
# the families the issue compares: dagtrain's orders and torch's classes of each
FAMILIES: dict[str, tuple[list[str], list[str]]] = {
    "gpipe": (["gpipe"], ["ScheduleGPipe"]),
    "1f1b": (["1f1b"], ["Schedule1F1B"]),
    # (two chunks a rank, looped or in a V)
    "interleaved": (
        ["1f1b-v2", "gpipe-v2", "1f1b-V", "gpipe-V"],
        ["ScheduleInterleaved1F1B", "ScheduleLoopedBFS"],
    ),
    "zero-bubble": (
        ["zero-bubble", "zero-bubble-v2", "zero-bubble-V"],
        ["ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"],
    ),
}
# an order and the torch class it is the same schedule as
PAIRS = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "gpipe-v2": "ScheduleLoopedBFS",
    "1f1b-v2": "ScheduleInterleaved1F1B",
    "zero-bubble-v2": "ScheduleInterleavedZeroBubble",
    "zero-bubble-V": "ScheduleZBVZeroBubble",
}
# torch's schedule classes that run on 2 ranks, and how their stages are placed
SCHEDULES: dict[str, str] = {
    "ScheduleGPipe": "single",
    "Schedule1F1B": "single",
    "ScheduleInterleaved1F1B": "loop",
    "ScheduleLoopedBFS": "loop",
    "ScheduleInterleavedZeroBubble": "loop",
    "ScheduleZBVZeroBubble": "v",
    "ScheduleDualPipeV": "v",
}
COMPUTE = ("F", "B", "W", "I")  # trace op kinds that are a stage's compute
JOB_TIMEOUT = 900


# --------------------------------------------------------------------------- shared


def _dataset(source: dict | None):
    """The data of a model entry (``data``, ``objective``, ``sequence_length``; digits
    by default) as dagtrain's trainer loads it: split with seed 0, a text cut into
    windows."""
    from dagtrain.training.rank.data import DataForm, load_dataset

    source = source or {}
    form = None
    if source.get("objective") == "language_model":
        form = DataForm("tokens", source["sequence_length"], objective="language_model")
    return load_dataset(source.get("data", DATA), TEST_FRACTION, 0, True, form)


def _units(source: dict | None) -> int:
    """The global batch's units the loss is divided by: samples, or tokens."""
    return BATCH * ((source or {}).get("sequence_length") or 1)


def _loss_fn(units: int):
    """The torch side's loss: cross-entropy summed over a microbatch's samples (or
    tokens: logits (N, L, V) against (N, L)), divided by the global batch's ``units``,
    as dagtrain's ``scaled_loss`` divides the objective's sum."""
    import torch.nn.functional as F

    def loss_fn(out, y):
        flat = out.reshape(-1, out.shape[-1])
        return F.cross_entropy(flat, y.reshape(-1), reduction="sum") / units

    return loss_fn


def _blocks(model: str, model_args: dict, source: dict | None = None) -> list:
    """The model's sequential blocks, built from seed 0 (the same on every side) on
    the data's ``DataInfo`` (the transformer is a causal LM over token ids)."""
    import torch

    from dagtrain.training.rank.models import build_model

    try:
        from dagtrain.training.rank.split import blocks_of
    except ImportError:  # before the pipeline code landed: nn.Sequential only

        def blocks_of(m):
            return list(m.blocks()) if hasattr(m, "blocks") else list(m.children())

    ds = _dataset(source)
    torch.manual_seed(0)
    return blocks_of(build_model(model, ds.in_shape, ds.classes, ds.info, **model_args))


def _balanced(costs: list[int], parts: int) -> list[int]:
    """The parts - 1 boundaries cutting ``costs`` into contiguous parts whose largest
    sum is smallest (the first such, scanning boundaries left to right)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best: dict[tuple[int, int], tuple[int, list[int]]] = {}

    def go(k: int, i: int) -> tuple[int, list[int]]:  # blocks[:i] into k parts
        if k == 1:
            return prefix[i], []
        if (k, i) not in best:
            options = []
            for j in range(k - 1, i):
                worst, cuts = go(k - 1, j)
                options.append((max(worst, prefix[i] - prefix[j]), [*cuts, j]))
            best[k, i] = min(options, key=lambda o: o[0])
        return best[k, i]

    return go(parts, n)[1]


def splits(model: str, model_args: dict, source: dict | None = None) -> dict[str, Any]:
    """Boundaries for 2 and 4 pieces, balancing parameters (the same on both sides;
    deterministic, where a measured split would move from run to run)."""
    blocks = _blocks(model, model_args, source)
    costs = [sum(p.numel() for p in b.parameters()) for b in blocks]
    return {
        "blocks": len(blocks),
        "params": costs,
        "split2": _balanced(costs, 2),
        "split4": _balanced(costs, 4),
    }


def _global_batches(n_steps: int, source: dict | None = None) -> list[tuple[Any, Any]]:
    """The first ``n_steps`` full global batches of the training split, in dagtrain's
    order (shard_batches with one part), cycling over epochs."""
    from dagtrain.training.rank.data import shard_batches

    ds = _dataset(source)
    out, epoch = [], 0
    while len(out) < n_steps:
        for idx, count in shard_batches(len(ds.x_train), BATCH, 0, 1, 0, epoch):
            if count == BATCH and len(out) < n_steps:
                out.append((ds.x_train[idx], ds.y_train[idx]))
        epoch += 1
    return out


# ------------------------------------------------------------------ torch side (rank)


class _SavedBytes:
    """Live bytes of the tensors autograd saved (``saved_tensors_hooks``), parameters
    excluded, and their peak. Bytes are the union of the regions the saved tensors span
    in each storage: a microbatch saved as a view of its global batch counts its own
    rows, a tensor saved twice (a ReLU's output, the next Linear's input) once."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.live: dict[int, dict[tuple[int, int], int]] = {}  # storage -> region -> refs
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()  # dagtrain's tasks may run on its worker threads

    @staticmethod
    def _union(regions) -> int:
        total, end = 0, -1
        for a, b in sorted(regions):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def pack(self, t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in self.exclude or st.nbytes() == 0 or t.numel() == 0:
            return (None, t)
        size = t.element_size()
        start = t.storage_offset() * size
        extent = (1 + sum((n - 1) * abs(k) for n, k in zip(t.shape, t.stride()))) * size
        region = (start, start + extent)
        with self.lock:
            held = self.live.setdefault(ptr, {})
            before = self._union(held)
            held[region] = held.get(region, 0) + 1
            self.now += self._union(held) - before
            self.peak = max(self.peak, self.now)
        return (_Ref(self, ptr, region), t)

    @staticmethod
    def unpack(packed):
        return packed[1]

    def release(self, ptr: int, region: tuple[int, int]) -> None:
        with self.lock:
            held = self.live[ptr]
            before = self._union(held)
            held[region] -= 1
            if not held[region]:
                del held[region]
            self.now -= before - self._union(held)
            if not held:
                del self.live[ptr]


class _Ref:
    __slots__ = ("owner", "ptr", "region")

    def __init__(self, owner: _SavedBytes, ptr: int, region: tuple[int, int]) -> None:
        self.owner, self.ptr, self.region = owner, ptr, region

    def __del__(self) -> None:
        self.owner.release(self.ptr, self.region)


_KIND = {
    "forward_one_chunk": "F",
    "backward_one_chunk": "B",
    "backward_weight_one_chunk": "W",
}


def _busy_timer(stage, busy: dict[str, float]) -> None:
    """Time the stage's compute calls into ``busy`` by kind (F: a forward, B: a
    backward, W: a weight gradient), as dagtrain's trace times its F/B/W tasks."""
    for name, kind in _KIND.items():
        fn = getattr(stage, name)

        def timed(*a, __fn=fn, __kind=kind, **k):
            t = time.perf_counter()
            try:
                return __fn(*a, **k)
            finally:
                busy[__kind] += time.perf_counter() - t

        setattr(stage, name, timed)


def _build_schedule(name: str, spec: dict, rank: int):
    """This rank's stages of ``name``, its schedule and optimizer, and a step function."""
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    kind = SCHEDULES[name]
    blocks = _blocks(spec["model"], spec["model_args"], spec)
    bounds = spec["split2"] if kind == "single" else spec["split4"]
    n_stages = len(bounds) + 1
    edges = [0, *bounds, len(blocks)]
    mine = {"single": [rank], "loop": [rank, rank + NPROCS], "v": [rank, 2 * NPROCS - 1 - rank]}[
        kind
    ]
    cpu = torch.device("cpu")
    stages = [
        PipelineStage(nn.Sequential(*blocks[edges[s] : edges[s + 1]]), s, n_stages, cpu)
        for s in mine
    ]
    busy = dict.fromkeys("FBW", 0.0)
    for st in stages:
        _busy_timer(st, busy)

    loss_fn = _loss_fn(_units(spec))

    cls = getattr(schedules, name)
    sched = cls(
        stages[0] if kind == "single" else stages,
        n_microbatches=spec["microbatches"],
        loss_fn=loss_fn,
        scale_grads=False,
    )
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)

    def step(x, y) -> None:
        losses: list = []
        if first and last:
            sched.step(x, target=y, losses=losses)
        elif first:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return mine, params, busy, step


def _run_schedule(built, spec: dict, batches: list) -> dict[str, Any]:
    import torch

    mine, params, busy, step = built
    times, busies = [], []
    n = spec["warmup"] + spec["steps"]
    for i in range(n):
        x, y = batches[i % len(batches)]
        for k in busy:
            busy[k] = 0.0
        t = time.perf_counter()
        step(x, y)
        dt = time.perf_counter() - t
        if i >= spec["warmup"]:
            times.append(dt)
            busies.append(dict(busy))
    # one more step, untimed, counting the saved activations
    count = _SavedBytes({p.untyped_storage().data_ptr() for p in params})
    with torch.autograd.graph.saved_tensors_hooks(count.pack, count.unpack):
        x, y = batches[n % len(batches)]
        step(x, y)
    return {
        "stages": mine,
        "step_seconds": times,
        "busy_seconds": busies,
        "peak_activation_bytes": count.peak,
        "activation_bytes_left": count.now,
    }


def _torch_rank(spec: dict, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    batches = _global_batches(spec["warmup"] + spec["steps"] + 1, spec)
    results: dict[str, Any] = {}
    path = Path(f"{out}-rank{rank}.json")
    for name in spec["schedules"]:
        dist.barrier()
        try:
            built = _build_schedule(name, spec, rank)
        except Exception as e:  # raised on both ranks alike (the classes' checks)
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
            path.write_text(json.dumps({"rank": rank, "results": results}))
            continue
        try:
            results[name] = _run_schedule(built, spec, batches)
        except Exception as e:
            # a rank that failed mid-step may leave its peer waiting on a transfer: this
            # job ends here, and the parent runs the schedules left in a new one
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
            path.write_text(json.dumps({"rank": rank, "results": results}))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
        del built
        path.write_text(json.dumps({"rank": rank, "results": results}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------- dagtrain side (rank)


def _dagtrain_config(spec: dict):
    from dagtrain.config import TrainConfig

    return TrainConfig(
        model={"name": spec["model"], "args": spec["model_args"]},
        training={
            "batch_size": BATCH,
            "epochs": 100,
            # and, in a timed job, one more, untimed: the run's last step is traced (its
            # trace written, its saved activations counted), as torch's counting step
            # is untimed (the counting job writes no trace)
            "max_steps": spec["warmup"] + spec["steps"] + (1 if spec["trace_dir"] else 0),
            "lr": LR,
            "momentum": MOMENTUM,
        },
        distributed={"backend": "torch", "ranks": NPROCS, "collective_timeout": 120},
        parallel={
            "stages": 2,
            "microbatches": spec["microbatches"],
            "order": spec["order"].removesuffix("-v2").removesuffix("-V"),
            "chunks": 2 if spec["order"].endswith(("-v2", "-V")) else 1,
            "placement": "v" if spec["order"].endswith("-V") else "looped",
            "split": spec["split4"] if spec["order"].endswith(("-v2", "-V")) else spec["split2"],
        },
        data=spec.get("data", DATA),
        objective={"name": spec.get("objective", "classification")},
        sequence_length=spec.get("sequence_length"),
        test_fraction=TEST_FRACTION,
        trace_dir=spec["trace_dir"],
        executor={"trace": True, "intra_op_threads": 1},
    )


def _count_dagtrain(exclude: set[int]) -> _SavedBytes:
    """Make dagtrain's pipeline count its saved tensors also as the torch side does
    (its own count goes on): the cross-check job's, never a timed one."""
    import torch

    from dagtrain.training.rank.activations import ActivationBytes

    count = _SavedBytes(exclude)
    theirs = ActivationBytes.counting

    def both(self):
        seen, hooks = theirs(self)
        if not exclude:
            exclude.update(self._params)

        def pack_both(t, __own=hooks.pack_hook):
            __own(t)
            return count.pack(t)

        return seen, torch.autograd.graph.saved_tensors_hooks(pack_both, count.unpack)

    ActivationBytes.counting = both
    return count


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dagtrain_rank(spec: dict, out: str) -> None:
    from dagtrain.training import train

    count = _count_dagtrain(set()) if spec.get("count") else None
    r = train(_dagtrain_config(spec))
    got = json.loads(r.to_json())
    got["maxrss_mb"] = _maxrss_mb()
    if count is not None:  # and what is still alive once the run is over
        got["saved_bytes_peak"], got["saved_bytes_left"] = count.peak, count.now
    Path(f"{out}-rank{r.rank}.json").write_text(json.dumps(got))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as dagtrain's rank does on gloo: no teardown after the work is done


# ------------------------------------------------------------------- parent (driver)


def _launch(spec: dict, tmp: Path, tag: str) -> list[dict]:
    """Run ``spec`` on NPROCS ranks; each rank's JSON (a failed job's ranks may have
    written theirs, and the error is added)."""
    from dagtrain.launch import launch

    out = tmp / tag
    for r in range(NPROCS):
        Path(f"{out}-rank{r}.json").unlink(missing_ok=True)
    lines: list[str] = []
    err = None
    env = {"PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    try:
        launch(
            ["benchmarks.pipeline_throughput", "--rank-of", json.dumps(spec), str(out)],
            NPROCS,
            "direct",
            env=env,
            on_line=lines.append,
            timeout=JOB_TIMEOUT,
        )
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        print(f"  [{tag}] failed: {err.splitlines()[0][:300]}", flush=True)
    ranks = []
    for r in range(NPROCS):
        p = Path(f"{out}-rank{r}.json")
        ranks.append(json.loads(p.read_text()) if p.exists() else {})
    if err is not None:
        for r in ranks:
            r["job_error"] = err
            r["log_tail"] = lines[-20:]
    return ranks


def _run_torch(model: dict, sp: dict, names: list[str], args, tmp: Path) -> dict[str, Any]:
    """One job running ``names`` in turn; a schedule that brings the job down is
    recorded with its error and the rest are run again without it."""
    done: dict[str, Any] = {}
    todo = list(names)
    while todo:
        spec = {
            "side": "torch",
            **model,
            **sp,
            "microbatches": args.microbatches,
            "warmup": args.warmup,
            "steps": args.steps,
            "schedules": todo,
        }
        ranks = _launch(spec, tmp, "torch")
        per = [r.get("results", {}) for r in ranks]
        for name in todo:
            got = [p.get(name) for p in per]
            if all(g is not None and "error" not in g for g in got):
                done[name] = {
                    "step_seconds": [max(ts) for ts in zip(*(g["step_seconds"] for g in got))],
                    "busy_seconds": [g["busy_seconds"] for g in got],
                    "rank_step_seconds": [g["step_seconds"] for g in got],
                    "peak_activation_bytes": [g["peak_activation_bytes"] for g in got],
                    "stages": [g["stages"] for g in got],
                }
            elif any(g is not None for g in got):
                errs = [g["error"] for g in got if g is not None and "error" in g]
                done[name] = {"error": errs[0] if errs else ranks[0].get("job_error")}
        left = [n for n in todo if n not in done]
        if left == todo:  # the job died before it ran anything: blame the first
            done[todo[0]] = {
                "error": ranks[0].get("job_error", "no result"),
                "log_tail": ranks[0].get("log_tail"),
            }
            left = todo[1:]
        todo = left
    return done


def _trace_summary(path: Path) -> dict[str, Any] | None:
    """From one rank's step trace: its span, the time its F/B/W tasks ran (merged: the
    executor may run two at once), the bubble as 1 - compute / span, and the time per
    kind of op."""
    if not path.exists():
        return None
    ev = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    if not ev:
        return None
    t0 = min(e["ts"] for e in ev)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    from dagtrain.records.trace import parse_op

    kinds: dict[str, float] = {}
    spans = []
    for e in ev:
        name = e["name"]
        op = parse_op(name)  # (F3, or F3.1 with chunks: its kind, F)
        kind = op[0].value if op else (name.rstrip("0123456789[]").rstrip("[") or name)
        kinds[kind] = kinds.get(kind, 0.0) + e["dur"] / 1e3
        if op is not None and kind in COMPUTE:
            spans.append((e["ts"], e["ts"] + e["dur"]))
    busy = 0.0
    end = -1.0
    for a, b in sorted(spans):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    span = t1 - t0
    return {
        "span_ms": span / 1e3,
        "compute_ms": busy / 1e3,
        "bubble": 1 - busy / span if span > 0 else None,
        "ms_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items())},
        "ops": len(ev),
    }


COUNT_STEPS = 4


def _count_job(model: dict, sp: dict, order: str, args, tmp: Path) -> dict[str, Any]:
    """dagtrain's saved-tensor bytes per rank counted as the torch side counts them, in
    a job of its own (COUNT_STEPS steps, untimed): the peak, and what is still alive
    after the run (a step's activations should all be gone by its end); or the error."""
    spec = {
        "side": "dagtrain",
        **model,
        **sp,
        "microbatches": args.microbatches,
        "warmup": 0,
        "steps": COUNT_STEPS,
        "order": order,
        "trace_dir": None,
        "count": True,
    }
    ranks = _launch(spec, tmp, f"count-{order}")
    if any("saved_bytes_peak" not in r for r in ranks):
        return {"error": next((r["job_error"] for r in ranks if "job_error" in r), "no result")}
    return {
        "steps": COUNT_STEPS,
        "peak": [r["saved_bytes_peak"] for r in ranks],
        "left_after_run": [r["saved_bytes_left"] for r in ranks],
        "dagtrain_reported_peak": [
            (r.get("pipeline") or {}).get("peak_activation_bytes") for r in ranks
        ],
    }


def _run_dagtrain(model: dict, sp: dict, order: str, args, tmp: Path) -> dict[str, Any]:
    trace_dir = tmp / f"trace-{order}"
    trace_dir.mkdir(exist_ok=True)
    for f in trace_dir.glob("*.json"):
        f.unlink()
    spec = {
        "side": "dagtrain",
        **model,
        **sp,
        "microbatches": args.microbatches,
        "warmup": args.warmup,
        "steps": args.steps,
        "order": order,
        "trace_dir": str(trace_dir),
    }
    ranks = _launch(spec, tmp, f"dagtrain-{order}")
    if any("job_error" in r or "step_seconds" not in r for r in ranks):
        r = next((r for r in ranks if "job_error" in r), ranks[0])
        return {"error": r.get("job_error", "no result"), "log_tail": r.get("log_tail")}
    timed = [r["step_seconds"][args.warmup : args.warmup + args.steps] for r in ranks]
    pipe = [r.get("pipeline") or {} for r in ranks]
    return {
        "step_seconds": [max(ts) for ts in zip(*timed)],
        "rank_step_seconds": timed,
        "peak_activation_bytes": [p.get("peak_activation_bytes") for p in pipe],
        "bubble_reported": [p.get("bubble") for p in pipe],
        "pipeline": pipe,
        "traces": [_trace_summary(trace_dir / f"step-rank{r}.json") for r in range(NPROCS)],
    }


def _round_jobs(names: list[str], orders: list[str]) -> list[str]:
    """A round's jobs: each dagtrain order next to torch's schedule of its pair (PAIRS),
    then the others, torch's and dagtrain's in turn. The round's order is rotated by
    one each round (which also swaps who goes first in a pair), so a pair runs seconds
    apart and a slow spell of the machine meets both of it, not one side's block."""
    theirs = [f"torch {n}" for n in names]
    ours = list(orders)
    jobs: list[str] = []
    for o, t in PAIRS.items():
        if o in ours and f"torch {t}" in theirs:
            jobs += [f"torch {t}", o]
            ours.remove(o)
            theirs.remove(f"torch {t}")
    for a, b in itertools.zip_longest(theirs, ours):
        jobs += [j for j in (a, b) if j is not None]
    return jobs


def _by_round(systems: dict[str, Any], a: str, b: str) -> list[float]:
    """System ``a``'s samples/s over ``b``'s in each round both ran."""

    def by(k: str) -> dict[int, float]:
        v = systems[k]
        return dict(zip(v["rounds_ran"], v["rounds_samples_per_s"]))

    ra, rb = by(a), by(b)
    return [ra[i] / rb[i] for i in sorted(ra.keys() & rb.keys())]


def _formula(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def _summarise(name: str, runs: list[dict], m: int, tokens: int = 0) -> dict[str, Any]:
    """One system's figures over its rounds (``tokens``: a sample's, for tokens/s)."""
    errs = [r["error"] for r in runs if "error" in r]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        out = {"error": errs[0]}
        if runs and runs[0].get("log_tail"):
            out["log_tail"] = runs[0]["log_tail"]
        return out
    steps = [s for r in ok for s in r["step_seconds"]]
    med = statistics.median(steps)
    out: dict[str, Any] = {
        "samples_per_s": BATCH / med,
        "median_step_ms": med * 1e3,
        "min_step_ms": min(steps) * 1e3,
        # the fastest tenth: what the system does in the quiet spells of a shared machine
        "fastest_tenth_step_ms": sorted(steps)[(len(steps) - 1) // 10] * 1e3,
        "rounds_samples_per_s": [BATCH / statistics.median(r["step_seconds"]) for r in ok],
        "rounds_ran": [i for i, r in enumerate(runs) if "error" not in r],
        "timed_steps": len(steps),
        "peak_activation_bytes": ok[-1]["peak_activation_bytes"],
    }
    if tokens:
        out["tokens_per_s"] = BATCH * tokens / med
    if errs:
        out["failed_rounds"] = errs
    if name.startswith("torch "):
        cls = name.split(" ", 1)[1]
        # measured bubble per rank: 1 - its compute time / the step (the slower rank's)
        per_rank = []
        for rank in range(NPROCS):
            fr = [
                1 - sum(b.values()) / s
                for r in ok
                for b, s in zip(r["busy_seconds"][rank], r["rank_step_seconds"][rank])
            ]
            per_rank.append(statistics.median(fr))
        out["bubble_measured"] = per_rank
        # median ms a step in each kind of compute, per rank (as the trace's ms_by_kind)
        out["compute_ms_by_kind"] = [
            {
                k: round(
                    statistics.median(b[k] for r in ok for b in r["busy_seconds"][rank]) * 1e3, 3
                )
                for k in "FBW"
            }
            for rank in range(NPROCS)
        ]
        out["stages_per_rank"] = ok[-1]["stages"]
        if SCHEDULES[cls] == "single":
            out["bubble_formula"] = _formula(NPROCS, m)
    else:
        out["bubble_reported"] = ok[-1]["bubble_reported"]
        out["bubble_formula"] = _formula(NPROCS, m) if name.split()[1] != "zero-bubble" else None
        tr = ok[-1]["traces"]
        out["bubble_from_trace"] = [t["bubble"] if t else None for t in tr]
        out["trace_last_step"] = tr
        out["pipeline"] = ok[-1]["pipeline"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per system per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds interleaving the systems")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps per block")
    ap.add_argument("--microbatches", type=int, default=MICROBATCHES)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    ap.add_argument(
        "--torch-only", action="store_true", help="leave dagtrain out (before it lands)"
    )
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="torch classes")
    ap.add_argument("--orders", default=",".join(ORDERS), help="dagtrain's orders")
    ap.add_argument("--quick", action="store_true", help="1 round of 3 steps, a smoke run")
    ap.add_argument("--out", default=None, help=out_help("pipeline_throughput"))
    ap.add_argument("--rank-of", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model-args", default=None, help=argparse.SUPPRESS)  # JSON, tests
    args = ap.parse_args()
    if args.rank_of:
        spec = json.loads(args.rank_of[0])
        (_torch_rank if spec["side"] == "torch" else _dagtrain_rank)(spec, args.rank_of[1])
        return
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 3, 1
    args.out = str(results_path("pipeline_throughput", args.out, args.quick))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = [n for n in args.schedules.split(",") if n]
    models = {k: dict(MODELS[k]) for k in args.models.split(",")}
    if args.model_args:
        for k, v in json.loads(args.model_args).items():
            models[k]["model_args"] = v
    orders = [] if args.torch_only else [o for o in args.orders.split(",") if o]
    if orders and importlib.util.find_spec("dagtrain.training.rank.pipelining") is None:
        print("dagtrain.training.rank.pipelining is not there: dagtrain's side is pending")
        orders = []
    m = args.microbatches
    print(
        f"{NPROCS} ranks on {os.cpu_count()} CPUs (gloo), global batch {BATCH}, {m} "
        f"microbatches, {args.rounds} rounds x {args.steps} timed steps after "
        f"{args.warmup} warm-up per system; samples/s of the median step"
    )
    results: dict[str, Any] = {}
    loads: list[float] = []  # the 1-minute load average as each job starts
    model_loads: dict[str, list[float]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for mname, model in models.items():
            sp = splits(model["model"], model["model_args"], model)
            print(
                f"\n{mname}: {sp['blocks']} blocks, {sum(sp['params']) / 1e6:.1f}M "
                f"parameters; 2 stages from block {sp['split2']}, 4 from {sp['split4']}",
                flush=True,
            )
            runs: dict[str, list[dict]] = {}
            # every system in a job of its own (fresh processes, the same warm-up): a
            # schedule that ran after others in one process would find its allocator
            # and caches warm, which dagtrain's fresh ranks do not
            jobs = _round_jobs(names, orders)
            model_started = time.perf_counter()
            for rnd in range(args.rounds):
                shift = rnd % len(jobs)
                for job in jobs[shift:] + jobs[:shift]:
                    loads.append(os.getloadavg()[0])
                    model_loads.setdefault(mname, []).append(loads[-1])
                    t = time.perf_counter()
                    if job.startswith("torch "):
                        got = _run_torch(model, sp, [job.removeprefix("torch ")], args, tmp)
                        for name, r in got.items():
                            runs.setdefault(f"torch {name}", []).append(r)
                    else:
                        r = _run_dagtrain(model, sp, job, args, tmp)
                        runs.setdefault(f"dagtrain {job}", []).append(r)
                    print(f"  round {rnd + 1}: {job} {time.perf_counter() - t:.0f} s", flush=True)
            tokens = model.get("sequence_length") or 0
            systems = {k: _summarise(k, v, m, tokens) for k, v in sorted(runs.items())}
            for order in orders:  # the same count as torch's, in jobs of their own
                t = time.perf_counter()
                got = _count_job(model, sp, order, args, tmp)
                sys_ = systems[f"dagtrain {order}"]
                sys_["saved_bytes_counted_as_torch"] = got
                sys_["peak_activation_bytes_counted_as_torch"] = got.get("peak")
                print(f"  count: {order} {time.perf_counter() - t:.0f} s", flush=True)
            sps = {k: v["samples_per_s"] for k, v in systems.items() if "samples_per_s" in v}
            ours = {k: v for k, v in sps.items() if k.startswith("dagtrain ")}
            theirs = {k: v for k, v in sps.items() if k.startswith("torch ")}
            ratios: dict[str, Any] = {}
            if ours and theirs:
                bo, bt = max(ours, key=ours.get), max(theirs, key=theirs.get)
                ratios = {
                    "best_vs_torch_best": ours[bo] / theirs[bt],
                    "dagtrain_best": bo,
                    "torch_best": bt,
                }
                for fam, (os_, ts) in FAMILIES.items():
                    a = [sps[f"dagtrain {o}"] for o in os_ if f"dagtrain {o}" in sps]
                    b = [sps[f"torch {t}"] for t in ts if f"torch {t}" in sps]
                    if a and b:
                        ratios[f"family_{fam}_best_vs_torch_best"] = max(a) / max(b)
                # each ratio round by round too (each round ran a pair seconds apart, so
                # it saw the same spell of the machine): their spread is what a ratio
                # can be trusted to
                per_round = {"best_vs_torch_best": _by_round(systems, bo, bt)}
                for o, t in PAIRS.items():
                    if f"dagtrain {o}" in sps and f"torch {t}" in sps:
                        ratios[f"{o}_vs_torch_{t}"] = sps[f"dagtrain {o}"] / sps[f"torch {t}"]
                        per_round[f"{o}_vs_torch_{t}"] = _by_round(
                            systems, f"dagtrain {o}", f"torch {t}"
                        )
                        # peak activations per rank, dagtrain's counted as torch's / torch's
                        ours_peak = systems[f"dagtrain {o}"].get(
                            "peak_activation_bytes_counted_as_torch"
                        )
                        theirs_peak = systems[f"torch {t}"]["peak_activation_bytes"]
                        if ours_peak:
                            ratios[f"{o}_peak_activation_vs_torch_{t}"] = [
                                a / b if b else None for a, b in zip(ours_peak, theirs_peak)
                            ]
                ratios["rounds"] = per_round
                fast = {
                    k: BATCH / (v["fastest_tenth_step_ms"] / 1e3)
                    for k, v in systems.items()
                    if "fastest_tenth_step_ms" in v
                }
                fo = max((k for k in fast if k in ours), key=fast.get)
                ft = max((k for k in fast if k in theirs), key=fast.get)
                ratios["fastest_tenth"] = {
                    "best_vs_torch_best": fast[fo] / fast[ft],
                    "dagtrain_best": fo,
                    "torch_best": ft,
                    **{f"best_vs_{k}": fast[fo] / v for k, v in fast.items() if k in theirs},
                }
            else:
                ratios = {"best_vs_torch_best": None, "pending": "dagtrain's side did not run"}
            ml = model_loads.get(mname, [0.0])
            results[mname] = {
                "model": model,
                "split": sp,
                "systems": systems,
                "ratios": ratios,
                "measured": {
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                    "steps_per_round": args.steps,
                    "rounds": args.rounds,
                    "warmup": args.warmup,
                    "seconds": round(time.perf_counter() - model_started, 1),
                    "load_average_at_job_starts": [min(ml), max(ml)],
                },
            }
            if tokens:
                results[mname]["tokens_per_sample"] = tokens
            _print(mname, systems, ratios)
    elapsed = time.perf_counter() - started
    out = Path(args.out)
    doc = _merged(out, results)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(
        json.dumps(
            {
                **doc,
                "date": time.strftime("%Y-%m-%d"),
                "ranks": NPROCS,
                "cpus": os.cpu_count(),
                "batch": BATCH,
                "microbatches": m,
                "steps_per_round": args.steps,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "dagtrain": "pending" if not orders else "run",
                "seconds": round(elapsed, 1),
                "load_average_at_job_starts": [min(loads, default=0), max(loads, default=0)],
                "results": {**doc.get("results", {}), **results},
            },
            indent=1,
        )
        + "\n"
    )
    tmp_out.replace(out)
    print(
        f"\nwrote {args.out} ({elapsed:.0f} s; load average {min(loads, default=0):.1f}-"
        f"{max(loads, default=0):.1f} as the jobs started)"
    )


def _merged(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    """What to keep of the file: nothing after a run of every model; after a run of
    some, the file's entries of the others (each marked with the run it came from,
    ``measured``) and a ``notes`` saying so."""
    if set(results) >= set(MODELS) or not out.exists():
        return {}
    old = json.loads(out.read_text())
    kept = {k: v for k, v in old.get("results", {}).items() if k not in results}
    if not kept:
        return {}
    keys = ("date", "steps_per_round", "rounds", "warmup", "seconds", "load_average_at_job_starts")
    for v in kept.values():
        v.setdefault("measured", {k: old.get(k) for k in keys})
    note = (
        f"{', '.join(results)} measured {time.strftime('%Y-%m-%d')} on their own and merged; "
        f"{', '.join(kept)} kept from an earlier run: each entry's 'measured' says when"
    )
    return {"notes": note, "results": kept}


def _mb(xs: list) -> str:
    return "/".join("-" if x is None else f"{x / 2**20:.2f}" for x in xs)


def _print(mname: str, systems: dict, ratios: dict) -> None:
    print(f"\n{mname}")
    print(
        f"  {'system':<38}{'samples/s':>10}{'bubble':>12}{'formula':>9}  peak activation"
        " MB per rank (dagtrain: its own; counted as torch's)"
    )
    for k, v in systems.items():
        if "error" in v:
            print(f"  {k:<38} failed: {v['error'].splitlines()[0][:120]}")
            continue
        b = v.get("bubble_reported") or v.get("bubble_measured") or []
        bub = "/".join("-" if x is None else f"{x:.2f}" for x in b)
        f = v.get("bubble_formula")
        peak = _mb(v["peak_activation_bytes"])
        same = v.get("peak_activation_bytes_counted_as_torch")
        if same is not None:
            peak += f"; {_mb(same)}"
        elif k.startswith("dagtrain "):
            peak += "; failed"
        if "tokens_per_s" in v:
            peak += f"  ({v['tokens_per_s']:.0f} tokens/s)"
        print(
            f"  {k:<38}{v['samples_per_s']:>10.1f}{bub:>12}"
            f"{'' if f is None else f'{f:.3f}':>9}  {peak}"
        )
    shown = {k: v for k, v in ratios.items() if isinstance(v, float)}
    print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in shown.items()))
    rounds = ratios.get("rounds", {})
    if rounds:
        print(
            "  round by round: "
            + ", ".join(f"{k} {min(v):.2f}-{max(v):.2f}x" for k, v in rounds.items() if v)
        )
    fast = ratios.get("fastest_tenth", {})
    if fast:
        shown = {k: v for k, v in fast.items() if isinstance(v, float)}
        print(
            f"  fastest tenth of the steps ({fast['dagtrain_best']}): "
            + ", ".join(f"{k} {v:.2f}x" for k, v in shown.items())
        )


if __name__ == "__main__":
    main()
