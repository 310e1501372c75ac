"""Gradient accumulation keeps allreduce's overlap: the exposed allreduce of a step with
``training.accumulation_steps`` 1 and 2 (the same global batch), from the steps' traces.

    .venv/bin/python benchmarks/accumulation_overlap.py [--models mlp-21M,causal-lm]
        [--steps 30]

2 ranks under mpirun (backend mpi, one intra-op thread each, 2 executor workers), fp32,
the models and global batches of train_throughput.py; each rank builds both runs' data,
model and step graph as the trainer does (recipe_throughput.py's ``rank_main``: the
overlapped step forced, ``OverlapChoice`` off) and runs their steps in turn, a barrier
before each, ABBA order. Every step is traced (``StepGraph.run(trace=...)``, the Chrome
JSON a run's ``trace_dir`` + ``executor.trace`` gives: one lane per worker) and read back
per step:

- **allreduce**: the summed duration of the step's ``allreduce[k]`` tasks (the bucket's
  sum over the ranks and the pass that averages and checks it);
- **exposed**: from the end of ``forward-backward`` (the last chunk's backward) to the end
  of the last allreduce: the allreduce time the step waits for after backward;
- **hidden**: the share of the allreduce time that ran while ``forward-backward`` ran;
- **last chunk**: forward+backward of the last chunk (k=2: the second half of the share),
  and when the first allreduce started after that chunk began: an earlier chunk's
  backward must not release a bucket, so with k=2 it is never negative.

Medians over the timed steps of each rank (and the fastest tenth of exposed and span:
the quiet spells of a shared machine), and of the per-pair differences k=2 - k=1.
Writes benchmarks/results/accumulation_overlap.json.
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

from benchmarks.recipe_throughput import WARMUP, launch_ranks  # noqa: E402
from benchmarks.train_throughput import MODELS, NPROCS, _quantile, batch_of  # noqa: E402

NAMES = ("mlp-21M", "causal-lm")
VARIANTS = ({"accumulation_steps": 1}, {"accumulation_steps": 2})


def read_trace(path: str, chunks: list[list[float]]) -> dict:
    """One step's figures (ms) from its Chrome trace; ``chunks``: the step's chunks'
    (start, end) in perf_counter seconds (placed on the trace's clock by the end of the
    last chunk, which is forward-backward's end to a few µs)."""
    ev = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e["ph"] == "X"]
    fb = next(e for e in ev if e["name"] == "forward-backward")
    f0, f1 = fb["ts"], fb["ts"] + fb["dur"]
    ar = sorted(
        ((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("allreduce[")),
        key=lambda a: a[0],
    )
    total = sum(b - a for a, b in ar)
    hidden = sum(max(0.0, min(b, f1) - max(a, f0)) for a, b in ar)
    last0 = f1 - (chunks[-1][1] - chunks[-1][0]) * 1e6  # the last chunk's start, µs
    ms = 1e-3
    return {
        "forward_backward": fb["dur"] * ms,
        "last_chunk": (f1 - last0) * ms,
        "allreduce": total * ms,
        "exposed": max(0.0, ar[-1][1] - f1) * ms,
        "hidden_fraction": hidden / total if total > 0 else None,
        "first_allreduce_after_last_chunk_start": (ar[0][0] - last0) * ms,
        "span": (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) * ms,
        "buckets": len(ar),
    }


def measure(name: str, steps: int, tmp: str) -> dict:
    spec = {"model": name, "variants": list(VARIANTS), "steps": steps + WARMUP, "trace": True}
    load = os.getloadavg()[0]
    ranks = launch_ranks(spec, tmp)
    per_rank = {}
    for r, got in enumerate(ranks):
        figs = [
            [read_trace(row["trace"], row["chunks"]) for row in rows[WARMUP:]]
            for rows in got["rows"]
        ]
        k1, k2 = figs
        keys = [k for k in k1[0] if k != "buckets"]
        med = {
            f"k={v['accumulation_steps']}": {
                k: round(statistics.median(s[k] for s in f), 3) for k in keys
            }
            for v, f in zip(VARIANTS, figs)
        }
        # the quiet spells of this shared machine: the fastest tenth of the steps
        for v, f in zip(VARIANTS, figs):
            m = med[f"k={v['accumulation_steps']}"]
            m["exposed_fastest_tenth"] = round(_quantile([s["exposed"] for s in f], 0.1), 3)
            m["span_fastest_tenth"] = round(_quantile([s["span"] for s in f], 0.1), 3)
        med["k=2 - k=1 (median of pairs)"] = {
            k: round(statistics.median(b[k] - a[k] for a, b in zip(k1, k2)), 3)
            for k in ("exposed", "allreduce", "last_chunk", "span")
        }
        med["k=2 steps whose first allreduce began before the last chunk"] = sum(
            s["first_allreduce_after_last_chunk_start"] < 0 for s in k2
        )
        med["every step, exposed ms"] = {
            "k=1": [round(s["exposed"], 2) for s in k1],
            "k=2": [round(s["exposed"], 2) for s in k2],
        }
        per_rank[f"rank {r}"] = med
    entry = {
        "model": MODELS[name],
        "batch": batch_of(name),
        "buckets": ranks[0]["graphs"][0]["buckets"],
        "per_rank_ms": per_rank,
        "measured": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "steps": steps,
            "warmup": WARMUP,
            "load_average_at_start": load,
        },
    }
    _report(name, entry)
    return entry


def _report(name: str, e: dict) -> None:
    print(f"\n{name} (global batch {e['batch']}, {e['buckets']} buckets), medians in ms")
    for r, med in e["per_rank_ms"].items():
        for k in ("k=1", "k=2"):
            m = med[k]
            print(
                f"  {r} {k}: forward-backward {m['forward_backward']:7.1f} (last chunk "
                f"{m['last_chunk']:7.1f}), allreduce {m['allreduce']:6.1f}, exposed "
                f"{m['exposed']:6.1f}, hidden {m['hidden_fraction']:.0%}, first allreduce "
                f"{m['first_allreduce_after_last_chunk_start']:+7.1f} after the last chunk "
                f"began; step span {m['span']:7.1f}; fastest tenth: exposed "
                f"{m['exposed_fastest_tenth']:.1f}, span {m['span_fastest_tenth']:.1f}"
            )
        d = med["k=2 - k=1 (median of pairs)"]
        early = med["k=2 steps whose first allreduce began before the last chunk"]
        print(
            f"  {r} k=2 - k=1: exposed {d['exposed']:+.1f}, allreduce {d['allreduce']:+.1f}, "
            f"span {d['span']:+.1f}; k=2 steps with an allreduce before the last chunk: {early}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(NAMES), help="comma-separated, of MODELS")
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each k")
    ap.add_argument("--out", default=str(HERE / "results" / "accumulation_overlap.json"))
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(
        f"{NPROCS} ranks (mpi, the overlapped step forced), fp32, accumulation_steps 1 and "
        f"2 in turn, {args.steps} traced steps each after {WARMUP} warm-up; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    started = time.perf_counter()
    results = {}
    for n in names:
        with tempfile.TemporaryDirectory() as tmp:
            results[n] = measure(n, args.steps, tmp)
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "ranks": NPROCS,
        "cpus": os.cpu_count(),
        "backend": "mpi",
        "step": "overlapped (forced), 2 executor workers, 1 intra-op thread per rank, fp32",
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
