"""Overhead, METG and makespans of dagtrain.taskgraph against baselines, in one run.

    make bench            (or: .venv/bin/python benchmarks/taskgraph_overhead.py [--quick])

Baselines, measured in the same run on the same programs (benchmarks/patterns.py):
  sequential   a plain loop calling each task's function in program order: the floor
  threadpool   concurrent.futures.ThreadPoolExecutor driven by dependence counting
  dask         dask's threaded scheduler (dask.threaded.get) on the same graph

Figures (printed as a table and written to benchmarks/results/taskgraph_overhead.json):
  us/task      wall time per empty task at 2 workers (first run, and a replay)
  METG(50%)    the smallest task duration (busy work that releases the GIL) at which
               the run keeps >= 50% efficiency: efficiency = n * g / (workers * wall)
  1M tasks     build + run of a 1,000,000-task stencil, per task, and memory per task
  makespan     executed makespan / lower bound, for GIL-releasing tasks of known cost
Speed is never asserted in the tests; this script reports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from patterns import program  # noqa: E402

from dagtrain.taskgraph import TaskGraph  # noqa: E402

WORKERS = 2


def noop(*args):
    return None


# ---------------------------------------------------------------- GIL-releasing busy work
_BUF = memoryview(os.urandom(1 << 22))


def _calibrate() -> float:
    """Bytes of sha256 per second in one call (hashlib releases the GIL above 2 KiB)."""
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        hashlib.sha256(_BUF)
        best = max(best, len(_BUF) / (time.perf_counter() - t))
    return best


RATE = _calibrate()


def busy_fn(seconds: float):
    n = max(2048, int(seconds * RATE))
    chunks = (
        [_BUF[o : o + min(n, len(_BUF))] for o in range(0, n, len(_BUF))]
        if n > len(_BUF)
        else [_BUF[:n]]
    )

    def busy(*args):
        for c in chunks:
            hashlib.sha256(c)

    return busy


# ---------------------------------------------------------------- runners
def build_graph(prog, fn) -> TaskGraph:
    g = TaskGraph()
    add = g.add
    for key, deps in prog:
        add(fn, out=key, in_=deps) if deps else add(fn, out=key)
    return g


def run_sequential(prog, fn, workers):
    t = time.perf_counter()
    for _key, _deps in prog:
        fn()
    return time.perf_counter() - t


def run_threadpool(prog, fn, workers):
    succs, npred = defaultdict(list), {}
    for key, deps in prog:
        npred[key] = len(deps)
        for d in deps:
            succs[d].append(key)
    lock, done, left = threading.Lock(), threading.Event(), [len(prog)]
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:

        def finish(key):
            ready = []
            with lock:
                for s in succs[key]:
                    npred[s] -= 1
                    if not npred[s]:
                        ready.append(s)
                left[0] -= 1
                last = not left[0]
            for s in ready:
                ex.submit(fn).add_done_callback(lambda f, s=s: finish(s))
            if last:
                done.set()

        for key, deps in prog:
            if not deps:
                ex.submit(fn).add_done_callback(lambda f, key=key: finish(key))
        done.wait()
        wall = time.perf_counter() - t
    return wall


def run_dask(prog, fn, workers):
    import dask.threaded

    dsk = {key: (fn, *deps) for key, deps in prog}
    t = time.perf_counter()
    dask.threaded.get(dsk, list(dsk), num_workers=workers)
    return time.perf_counter() - t


def run_dagtrain(prog, fn, workers, replay=False):
    g = build_graph(prog, fn)
    t = time.perf_counter()
    g.run(workers=workers)
    first = time.perf_counter() - t
    if not replay:
        return first
    t = time.perf_counter()
    g.run(workers=workers)
    return time.perf_counter() - t


RUNNERS = {
    "sequential": run_sequential,
    "dagtrain": run_dagtrain,
    "dagtrain-replay": lambda p, f, w: run_dagtrain(p, f, w, replay=True),
    "threadpool": run_threadpool,
    "dask": run_dask,
}


def median_wall(runner, prog, fn, workers, reps):
    return statistics.median(runner(prog, fn, workers) for _ in range(reps))


# ---------------------------------------------------------------- experiments
def overhead(quick: bool) -> dict:
    """us per empty task, every pattern, every runtime, at WORKERS workers."""
    out = {}
    for pattern in ("trivial", "chains", "stencil", "tree", "fft", "nearest"):
        row = {}
        for name, runner in RUNNERS.items():
            slow = name in ("threadpool", "dask")
            steps = (50 if slow else 600) // (4 if quick else 1)
            prog = program(pattern, 16, steps, seed=1)
            wall = median_wall(runner, prog, noop, WORKERS, 3 if slow else 5)
            row[name] = wall / len(prog) * 1e6
        out[pattern] = row
    return out


def metg(quick: bool) -> dict:
    """METG(50%) on the 3-dependence stencil, width 8, per runtime."""
    grains = [2e-6, 5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3]
    out = {}
    for name in ("dagtrain", "dagtrain-replay", "threadpool", "dask"):
        curve = []
        for g in grains:
            n_target = min(20000, max(400, int((0.08 if quick else 0.25) / g)))
            prog = program("stencil", 8, max(2, n_target // 8))
            wall = median_wall(RUNNERS[name], prog, busy_fn(g), WORKERS, 3)
            eff = len(prog) * g / (WORKERS * wall)
            curve.append((g, eff))
            if eff >= 0.9:
                break
        out[name] = {"metg_us": _metg(curve), "curve": [(g * 1e6, round(e, 3)) for g, e in curve]}
    return out


def _metg(curve) -> float | None:
    """Smallest grain with efficiency >= 50%, interpolated in log space between samples."""
    import math

    prev = None
    for g, eff in curve:
        if eff >= 0.5:
            if prev is None:
                return g * 1e6
            (g0, e0) = prev
            f = (0.5 - e0) / (eff - e0)
            return math.exp(math.log(g0) + f * (math.log(g) - math.log(g0))) * 1e6
        prev = (g, eff)
    return None


def makespans(quick: bool) -> list[dict]:
    """Executed makespan / lower bound for random DAGs of GIL-releasing tasks."""
    rows = []
    rng = random.Random(3)
    for _ in range(3 if quick else 6):
        n, width = 300, rng.choice([6, 10, 16])
        g = TaskGraph()
        for i in range(n):
            layer = i // width
            deps = [
                (j,)
                for j in range(max(0, (layer - 1) * width), layer * width)
                if rng.random() < 0.25
            ]
            dur = rng.uniform(0.2e-3, 2e-3)
            g.add(busy_fn(dur), name=f"t{i}", out=(i,), in_=deps, cost=dur)
        g.run(workers=WORKERS)  # warm up
        r = g.run(workers=WORKERS)
        # the bound from what the tasks really took in this run (calibration drifts)
        for t, d in zip(g.tasks, (e - s for s, e in zip(r.starts, r.ends))):
            t.cost = d
        g._prepared = False
        bound = g.lower_bound(WORKERS)
        rows.append(
            {
                "tasks": n,
                "width": width,
                "makespan_ms": r.makespan * 1e3,
                "lower_bound_ms": bound * 1e3,
                "ratio": r.makespan / bound,
            }
        )
    return rows


def scale(n: int, paused: bool) -> dict:
    """Build + run an n-task stencil of empty tasks (run in a fresh process)."""
    import contextlib

    from dagtrain.taskgraph import gc_paused

    width = 1000
    prog = program("stencil", width, n // width)
    rss0 = _rss()
    t = time.perf_counter()
    with gc_paused() if paused else contextlib.nullcontext():
        g = build_graph(prog, noop)
    built = time.perf_counter()
    rss1 = _rss()
    g.run(workers=WORKERS)
    done = time.perf_counter()
    return {
        "tasks": len(prog),
        "gc_paused": paused,
        "build_us": (built - t) / len(prog) * 1e6,
        "run_us": (done - built) / len(prog) * 1e6,
        "total_us": (done - t) / len(prog) * 1e6,
        "bytes_per_task": (max(rss1, _rss()) - rss0) / len(prog),
    }


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def scale_in_subprocess(n: int, paused: bool) -> dict:
    argv = [sys.executable, __file__, "--scale", str(n)] + (["--gc-paused"] if paused else [])
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)


# ---------------------------------------------------------------- report
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller runs")
    ap.add_argument("--scale", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--gc-paused", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "taskgraph_overhead.json"))
    args = ap.parse_args()
    if args.scale:
        print(json.dumps(scale(args.scale, args.gc_paused)))
        return

    print(
        f"dagtrain.taskgraph benchmarks, {WORKERS} workers, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    ov = overhead(args.quick)
    names = list(RUNNERS)
    print("\nus per empty task (median)      " + "".join(f"{n:>16}" for n in names))
    for pattern, row in ov.items():
        print(f"  {pattern:<29}" + "".join(f"{row[n]:>16.2f}" for n in names))
    st = ov["stencil"]
    ratios = {
        "dask_over_dagtrain": st["dask"] / st["dagtrain"],
        "threadpool_over_dagtrain": st["threadpool"] / st["dagtrain"],
        "dagtrain_over_sequential": st["dagtrain"] / st["sequential"],
        "replay_over_sequential": st["dagtrain-replay"] / st["sequential"],
    }
    print("  stencil ratios: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()))

    mt = metg(args.quick)
    print("\nMETG(50%) on the stencil, us (busy tasks that release the GIL)")
    for name, row in mt.items():
        v = row["metg_us"]
        print(f"  {name:<18}{'n/a' if v is None else f'{v:8.1f}'}   curve {row['curve']}")

    ms = makespans(args.quick)
    print("\nexecuted makespan / lower bound (random DAGs, tasks 0.2-2 ms with costs)")
    for row in ms:
        print(
            f"  {row['tasks']} tasks, width {row['width']:>2}: {row['makespan_ms']:7.1f} ms "
            f"/ {row['lower_bound_ms']:7.1f} ms = {row['ratio']:.3f}"
        )

    sizes = (100_000, 1_000_000) if not args.quick else (20_000, 200_000)
    sc, growth = {}, {}
    print("\nstencil of empty tasks, build + run, per task (a fresh process each)")
    for paused in (False, True):
        label = "gc paused" if paused else "plain add"
        rows = {n: scale_in_subprocess(n, paused) for n in sizes}
        for n, row in rows.items():
            print(
                f"  {label:<9} {n:>9,} tasks: build {row['build_us']:.2f} us + run "
                f"{row['run_us']:.2f} us = {row['total_us']:.2f} us, "
                f"{row['bytes_per_task']:.0f} bytes"
            )
        growth[label] = rows[sizes[1]]["total_us"] / rows[sizes[0]]["total_us"]
        print(f"  {label:<9} cost per task at {sizes[1]:,} / at {sizes[0]:,}: {growth[label]:.2f}x")
        sc[label] = {str(k): v for k, v in rows.items()}

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "workers": WORKERS,
        "quick": args.quick,
        "us_per_task": ov,
        "stencil_ratios": ratios,
        "metg": mt,
        "makespan": ms,
        "scale": sc,
        "scale_growth": growth,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
