"""bf16 against fp32: dagtrain's step time on CPU, both precisions on the same model,
data and batches, step by step in the same two ranks.

    .venv/bin/python benchmarks/recipe_throughput.py [--models mlp-21M,causal-lm]
        [--steps N] [--repeats 1]

The models and their global batches are train_throughput.py's (``MODELS``,
``batch_of``): the 21M-parameter MLP on digits (global batch 64) and the causal language
model on dags/data/corpus.txt (global batch 32, 64 tokens a sample). Each repeat is a
fresh job of 2 ranks under mpirun (backend mpi, one intra-op thread each, 2 executor
workers); each rank builds the run's data, model and step graph as the trainer does
(``RankRun``) once per variant (here ``training.precision`` fp32 and bf16: the same
seed, so the same initial weights), and then runs the variants' steps in turn, a barrier
before each, ABBA order (fp32 first on even steps, bf16 first on odd ones), so a slow
spell of this shared machine falls on both. The overlapped step is forced for every
variant (``OverlapChoice`` off): both run the same graph. The first WARMUP steps of each
variant are not timed; then STEPS pairs (4 for the MLP, 8 for the LM: a bf16 step of the
MLP takes seconds here). Each pair is a repeat; ``--repeats`` runs more jobs.

Printed per model: the median over all pairs of (bf16 step / fp32 step), the ratio of
the fastest tenths of the steps, each repeat's median pair ratio, and the same for the
forward+backward time alone (the part autocast changes; the allreduce and the update
are fp32 in both). Also the machine's bf16 support: the CPU's flags, torch's CPU
capability, whether oneDNN takes bf16 natively, the torch version. Writes
benchmarks/results/recipe_throughput.json.

``rank_main`` and ``launch_ranks`` are also accumulation_overlap.py's (it traces the
steps of ``training.accumulation_steps`` 1 and 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.train_throughput import MODELS, NPROCS, _quantile, batch_of  # noqa: E402

# the models measured (of train_throughput.MODELS) and their timed pairs of steps: a bf16
# step of the MLP takes seconds on a CPU without avx512_bf16 (see docs/benchmarks.md,
# "Precision and accumulation"), so fewer pairs than train_throughput.py's 30 steps
NAMES = ("mlp-21M", "causal-lm")
STEPS = {"mlp-21M": 4, "causal-lm": 8}
# untimed steps of each variant first (allocations, optimizer state); train_throughput.py's
# WARMUP of 5 would cost the MLP half a minute of bf16 steps per repeat
WARMUP = 1
PRECISIONS = ({"precision": "fp32"}, {"precision": "bf16"})


# ------------------------------------------------------------------ one rank
def rank_main(spec: dict, out: str) -> None:
    """One rank: every variant's step graph, the overlapped step forced; their steps in
    turn (ABBA), a barrier before each. Writes this rank's seconds (``out`` + ``.rank<N>``):
    per variant and step, the step's wall, forward+backward's, the chunks' (start, end)
    (perf_counter), and with ``spec['trace']`` the path of the step's Chrome trace."""
    import torch

    from dagtrain.config import TrainConfig
    from dagtrain.sync.mpi import MPIBackend
    from dagtrain.training.rank.trainer import RankRun, _batches

    torch.set_num_threads(1)
    backend = MPIBackend(600)
    rank, world = backend.rank, backend.size
    model = MODELS[spec["model"]]
    runs = []
    for overrides in spec["variants"]:
        cfg = TrainConfig(
            backend="mpi",
            ranks=world,
            epochs=1000,
            batch_size=batch_of(spec["model"]),
            lr=0.01,
            overlap=True,
            workers=2,
            intra_op_threads=1,
            collective_timeout=600,
            **model,
            **overrides,
        )
        rr = RankRun(cfg, backend)
        sg = rr.sg
        if not sg.overlap:
            raise SystemExit(f"{spec['model']}: one gradient bucket, no overlapped step")
        sg.choice, sg.overlapping = None, True  # the overlapped step, every step
        batches = _batches(rr.ds, cfg, rank, world, 0)
        sg.fetch = lambda batches=batches: next(batches, None)
        sg.prefetched = next(batches)
        chunks: list[tuple[float, float]] = []
        sg._chunk = _timed(sg._chunk, chunks)  # (start, end) of each chunk's fwd+bwd
        runs.append((sg, chunks, len(sg.buckets)))
        if rr.writer is not None:
            rr.writer.shutdown()
    rows: list[list[dict]] = [[] for _ in runs]
    trace_dir = Path(out).parent / f"traces-rank{rank}"
    trace_dir.mkdir(exist_ok=True)
    for step in range(spec["steps"]):
        order = range(len(runs)) if step % 2 == 0 else reversed(range(len(runs)))
        for i in order:
            sg, chunks, _ = runs[i]
            chunks.clear()
            trace = str(trace_dir / f"v{i}-step{step}.json") if spec.get("trace") else None
            backend.barrier()
            t0 = time.perf_counter()
            sg.run(sg.prefetched[2], trace=trace)
            wall = time.perf_counter() - t0
            rows[i].append(
                {
                    "step": wall,
                    "fb": sum(e - s for s, e in chunks),
                    "chunks": list(chunks),
                    "trace": trace,
                }
            )
    info = [{"buckets": n, "chunks": sg.chunks} for sg, _, n in runs]
    Path(f"{out}.rank{rank}").write_text(json.dumps({"rows": rows, "graphs": info}))
    backend.close()


def _timed(chunk, into: list):
    """``StepGraph._chunk`` that also appends its (start, end) to ``into``."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        chunk(*args, **kwargs)
        into.append((t0, time.perf_counter()))

    return timed


def launch_ranks(spec: dict, tmp: str) -> list[dict]:
    """Run ``rank_main(spec)`` on NPROCS ranks under mpirun; each rank's output."""
    from dagtrain.launch import launch

    out = str(Path(tmp) / "ranks.json")
    launch(
        ["benchmarks.recipe_throughput", "--rank", json.dumps(spec), out],
        NPROCS,
        "mpirun",
        on_line=lambda line: None,
        timeout=1800,
    )
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(NPROCS)]


# ------------------------------------------------------------------ the machine
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def bf16_support() -> dict:
    """What this machine offers bf16: the CPU's flags, torch's view of it."""
    import torch

    flags: set[str] = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name":
                model = value.strip()
    except OSError:
        pass
    try:
        onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn_bf16 = None
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "flags": {f: f in flags for f in FLAGS},
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16_native": onednn_bf16,
    }


def gemm_probe() -> dict:
    """ms of one (32 x 2048) @ (2048 x 2048) product in this process, one thread, fp32
    and bf16, with the right operand as stored (NN: a layer's input gradient, grad @ W)
    and transposed (NT: a layer's forward, x @ W.t()); the best of 3."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, w = torch.randn(32, 2048).to(dt), torch.randn(2048, 2048).to(dt)
            for lay, f in (("NN", lambda: a @ w), ("NT", lambda: a @ w.t())):
                f()
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    f()
                    best = min(best, time.perf_counter() - t0)
                out[f"{name} {lay}"] = round(best * 1e3, 2)
    finally:
        torch.set_num_threads(threads)
    return out


def describe(s: dict) -> str:
    have = [f for f, v in s["flags"].items() if v]
    lack = [f for f, v in s["flags"].items() if not v]
    return (
        f"{s['cpu']}, {s['cpus']} CPUs; flags: {' '.join(have) or '-'} "
        f"(not: {' '.join(lack) or '-'}); torch {s['torch']}, CPU capability "
        f"{s['cpu_capability']}, oneDNN bf16 native: {s['onednn_bf16_native']}"
    )


# ------------------------------------------------------------------ the figures
def measure(name: str, steps: int | None, repeats: int, tmp: str) -> dict:
    """fp32 and bf16 on ``name``, ``repeats`` fresh jobs of ``steps`` pairs each
    (default: STEPS[name])."""
    steps = steps or STEPS[name]
    spec = {"model": name, "variants": list(PRECISIONS), "steps": steps + WARMUP}
    every: dict[str, list[float]] = {"fp32": [], "bf16": []}
    fb: dict[str, list[float]] = {"fp32": [], "bf16": []}
    pairs, fb_pairs, per_repeat, loads = [], [], [], []
    for r in range(repeats):
        loads.append(os.getloadavg()[0])
        d = Path(tmp) / f"{name}-{r}"
        d.mkdir(parents=True)
        rows = launch_ranks(spec, str(d))[0]["rows"]  # rank 0's
        f32, b16 = rows[0][WARMUP:], rows[1][WARMUP:]
        ratios = [b["step"] / f["step"] for f, b in zip(f32, b16)]
        pairs += ratios
        fb_pairs += [b["fb"] / f["fb"] for f, b in zip(f32, b16)]
        per_repeat.append(statistics.median(ratios))
        for k, got in (("fp32", f32), ("bf16", b16)):
            every[k] += [x["step"] for x in got]
            fb[k] += [x["fb"] for x in got]
    ms = {k: round(1e3 * statistics.median(v), 2) for k, v in every.items()}
    fast = {k: round(1e3 * _quantile(v, 0.1), 2) for k, v in every.items()}
    fb_ms = {k: round(1e3 * statistics.median(v), 2) for k, v in fb.items()}
    entry = {
        "model": MODELS[name],
        "batch": batch_of(name),
        "step_ms_median": ms,
        "step_ms_fastest_tenth": fast,
        "forward_backward_ms_median": fb_ms,
        "ratio_bf16_over_fp32": {
            "step_median_of_pairs": round(statistics.median(pairs), 3),
            "step_fastest_tenth": round(fast["bf16"] / fast["fp32"], 3),
            "step_per_repeat": [round(x, 3) for x in per_repeat],
            "step_every_pair": [round(x, 3) for x in pairs],
            "forward_backward_median_of_pairs": round(statistics.median(fb_pairs), 3),
        },
        "measured": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "steps": steps,
            "warmup": WARMUP,
            "repeats": repeats,
            "load_average_at_repeat_starts": [min(loads), max(loads)],
        },
    }
    tokens = MODELS[name].get("sequence_length")
    if tokens:
        entry["tokens_per_s_median"] = {
            k: round(batch_of(name) * tokens / (v / 1e3)) for k, v in ms.items()
        }
    _report(name, entry)
    return entry


def _report(name: str, e: dict) -> None:
    r = e["ratio_bf16_over_fp32"]
    print(f"\n{name} (global batch {e['batch']})")
    for k in ("fp32", "bf16"):
        print(
            f"  {k}: step {e['step_ms_median'][k]:8.1f} ms median, "
            f"{e['step_ms_fastest_tenth'][k]:8.1f} ms fastest tenth; forward+backward "
            f"{e['forward_backward_ms_median'][k]:8.1f} ms"
        )
    print(
        f"  bf16 / fp32 step time: {r['step_median_of_pairs']:.2f}x (median of pairs), "
        f"{r['step_fastest_tenth']:.2f}x (fastest tenths); per repeat "
        f"{', '.join(f'{x:.2f}' for x in r['step_per_repeat'])}; forward+backward alone "
        f"{r['forward_backward_median_of_pairs']:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(NAMES), help="comma-separated, of MODELS")
    ap.add_argument("--steps", type=int, help="timed pairs per job (default: per model)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh jobs of 2 ranks, each")
    ap.add_argument("--out", default=str(HERE / "results" / "recipe_throughput.json"))
    ap.add_argument("--rank", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank[0]), args.rank[1])
        return
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    support = bf16_support()
    print(f"bf16 support: {describe(support)}")
    gemm = gemm_probe()
    print("one 32x2048 @ 2048x2048 product, ms: " + ", ".join(f"{k} {v}" for k, v in gemm.items()))
    print(
        f"{NPROCS} ranks (mpi), {args.steps or STEPS} pairs of steps after {WARMUP} "
        f"warm-up, {args.repeats} job(s); fp32 and bf16 in turn in the same ranks; load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: measure(n, args.steps, args.repeats, tmp) for n in names}
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "ranks": NPROCS,
        "backend": "mpi",
        "step": "overlapped (forced), 2 executor workers, 1 intra-op thread per rank",
        "bf16_support": support,
        "gemm_32x2048x2048_ms": gemm,
        "python": platform.python_version(),
        "results": results,
        "wall_s": round(time.perf_counter() - started),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.out} ({doc['wall_s']} s)")


if __name__ == "__main__":
    main()
