"""Overhead, METG and makespans of dagtrain.taskgraph against baselines, in one run.

    make bench            (or: .venv/bin/python benchmarks/taskgraph_overhead.py [--quick])

Systems, measured in the same run on the same programs (benchmarks/patterns.py):
  sequential   a plain loop calling each task's function in program order (no graph)
  minimal      the floor for a graph: a pure-Python dependence-counting loop (last
               writer and readers per item, successor lists, a FIFO), one thread
  dagtrain     TaskGraph, 2 workers, as a user runs it: the first run starts inline
               and hands its tasks to the team once they prove bigger than
               inline_below; replayed threaded (inline_below=0) and inline (default)
  dagtrain-threaded   the same graph with inline_below=0: the team from the first task
  threadpool   concurrent.futures.ThreadPoolExecutor driven by dependence counting
  dask         dask's threaded scheduler (dask.threaded.get) on the same graph

Every system is timed in the same phases, interleaved (one repeat of every system,
then the next repeat, in a rotating order), medians and minima reported:
  build        from the program to the system's graph (dask: its dict; the minimal
               loop and the thread pool: their successor lists and counts)
  first run    running that graph once (dask's get() includes its own analysis)
  build+run    the two together: what a graph used once costs
  replay       running the same built graph again: what a training step pays
               (dask and the thread pool have no built graph to keep: their replay
               is a second first run)

Figures (printed as a table and written to benchmarks/results/taskgraph_overhead.json;
with --quick, to the temporary folder):
  us/task      per empty task and phase, at 2 workers, the 100x100 3-point stencil
               and the Task-Bench patterns at width 16
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
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from patterns import program  # noqa: E402

from benchmarks._results import out_help, results_path  # noqa: E402
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
    """A TaskGraph of the program. Keys are tuples, so each is put in a list: a bare
    tuple given to a clause names several items (docs/taskgraph.md)."""
    g = TaskGraph()
    add = g.add
    for key, deps in prog:
        add(fn, out=[key], in_=deps) if deps else add(fn, out=[key])
    return g


def run_sequential(prog, fn, workers):
    t = time.perf_counter()
    for _key, _deps in prog:
        fn()
    return time.perf_counter() - t


# Each system: build(prog, fn) -> graph; run(graph, workers) -> None. Timed alike.
def minimal_build(prog, fn):
    """The floor of a graph built from depend clauses: per item its last writer and
    the readers since, per task its successors and predecessor count (in/out only)."""
    last: dict = {}
    readers: dict = {}
    fns, succs, npred = [], [], []
    for key, deps in prog:
        i = len(fns)
        fns.append(fn)
        succs.append([])
        preds = set()
        for d in deps:  # in: the last writer
            w = last.get(d)
            if w is not None:
                preds.add(w)
            r = readers.get(d)
            if r is None:
                readers[d] = [i]
            else:
                r.append(i)
        r = readers.pop(key, None)  # out: the readers since, else the last writer
        if r:
            preds.update(r)
        else:
            w = last.get(key)
            if w is not None:
                preds.add(w)
        last[key] = i
        npred.append(len(preds))
        for p in preds:
            succs[p].append(i)
    return fns, succs, npred


def minimal_run(graph, workers):
    fns, succs, npred = graph
    left = list(npred)
    ready = deque(i for i, n in enumerate(left) if not n)
    pop, push = ready.popleft, ready.append
    while ready:
        i = pop()
        fns[i]()
        for s in succs[i]:
            n = left[s] - 1
            left[s] = n
            if not n:
                push(s)


def threadpool_build(prog, fn):
    succs, npred = defaultdict(list), {}
    for key, deps in prog:
        npred[key] = len(deps)
        for d in deps:
            succs[d].append(key)
    return prog, fn, succs, npred


def threadpool_run(graph, workers):
    prog, fn, succs, npred0 = graph
    npred = dict(npred0)
    lock, done, left = threading.Lock(), threading.Event(), [len(prog)]
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


def dask_build(prog, fn):
    return {key: (fn, *deps) for key, deps in prog}


def dask_run(dsk, workers):
    import dask.threaded

    dask.threaded.get(dsk, list(dsk), num_workers=workers)


def dagtrain_run(g, workers):
    g.run(workers=workers, inline_below=0)  # the team from the first task


def dagtrain_default_run(g, workers):
    # what a user gets: a first run starts inline and hands its tasks to the team once
    # they prove bigger than inline_below; a replay of tiny tasks runs inline
    g.run(workers=workers)


# name: (build, first run, replays): a replay is a run of the graph already built;
# dask and the thread pool keep no built graph, so theirs is a second first run
SYSTEMS = {
    "minimal": (minimal_build, minimal_run, {"replay": minimal_run}),
    "dagtrain": (
        build_graph,
        dagtrain_default_run,
        {"replay": dagtrain_run, "replay_inline": dagtrain_default_run},
    ),
    "dagtrain-threaded": (build_graph, dagtrain_run, {}),
    "threadpool": (threadpool_build, threadpool_run, {"replay": threadpool_run}),
    "dask": (dask_build, dask_run, {"replay": dask_run}),
}
PHASES = ("build", "first", "build_run", "replay", "replay_inline")


def phases_once(system, prog, fn, workers) -> dict:
    """Seconds of build, first run and replay(s) of one system on one program."""
    build, run, replays = SYSTEMS[system]
    perf = time.perf_counter
    t0 = perf()
    graph = build(prog, fn)
    t1 = perf()
    run(graph, workers)
    t2 = perf()
    out = {"build": t1 - t0, "first": t2 - t1, "build_run": t2 - t0}
    for name, replay in replays.items():
        t = perf()
        replay(graph, workers)
        out[name] = perf() - t
    return out


def phases(prog, fn, workers, reps, systems=None) -> dict:
    """us per task of each phase and system over ``reps`` interleaved repeats (every
    system once, in a rotating order, then again): the median, the minimum (the least
    disturbed repeat) and the spread (max - min) / median."""
    systems = list(systems or SYSTEMS)
    samples: dict = {s: defaultdict(list) for s in systems}
    seq: list = []
    for r in range(reps):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        for s in order:
            for k, v in phases_once(s, prog, fn, workers).items():
                samples[s][k].append(v)
        seq.append(run_sequential(prog, fn, workers))
    n = len(prog)
    out = {"sequential": {"run": statistics.median(seq) / n * 1e6, "run_min": min(seq) / n * 1e6}}
    for s in systems:
        row = {}
        for k, v in samples[s].items():
            med = statistics.median(v)
            row[k] = med / n * 1e6
            row[k + "_min"] = min(v) / n * 1e6
            row[k + "_spread"] = (max(v) - min(v)) / med if med else 0.0
        out[s] = row
    return out


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


def run_threadpool(prog, fn, workers):
    t = time.perf_counter()
    threadpool_run(threadpool_build(prog, fn), workers)
    return time.perf_counter() - t


def run_dask(prog, fn, workers):
    t = time.perf_counter()
    dask_run(dask_build(prog, fn), workers)
    return time.perf_counter() - t


# METG: the run at a grain, after the build (the build does not depend on the grain);
# threadpool and dask include building their graph, as they always did (small: n <= 20k)
RUNNERS = {
    "dagtrain": run_dagtrain,
    "dagtrain-replay": lambda p, f, w: run_dagtrain(p, f, w, replay=True),
    "threadpool": run_threadpool,
    "dask": run_dask,
}


def median_wall(runner, prog, fn, workers, reps):
    return statistics.median(runner(prog, fn, workers) for _ in range(reps))


# ---------------------------------------------------------------- experiments
def overhead(quick: bool) -> dict:
    """us per empty task and phase: the 100x100 stencil (3 dependences), then every
    pattern at width 16, every system, at WORKERS workers."""
    out = {}
    steps = 150 if quick else 600
    cases = [("stencil 100x100", "stencil", 100, 25 if quick else 100)]
    cases += [(p, p, 16, steps) for p in ("trivial", "chains", "stencil", "tree", "fft", "nearest")]
    for label, pattern, width, nsteps in cases:
        prog = program(pattern, width, nsteps, seed=1)
        out[label] = phases(prog, noop, WORKERS, 5 if quick else 9)
        out[label]["tasks"] = len(prog)
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
                j for j in range(max(0, (layer - 1) * width), layer * width) if rng.random() < 0.25
            ]
            dur = rng.uniform(0.2e-3, 2e-3)
            g.add(busy_fn(dur), name=f"t{i}", out=i, in_=deps, cost=dur)
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
    ap.add_argument("--out", default=None, help=out_help("taskgraph_overhead"))
    args = ap.parse_args()
    args.out = str(results_path("taskgraph_overhead", args.out, args.quick))
    if args.scale:
        print(json.dumps(scale(args.scale, args.gc_paused)))
        return

    print(
        f"dagtrain.taskgraph benchmarks, {WORKERS} workers, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    ov = overhead(args.quick)
    print(
        "\nus per empty task: median (minimum) of interleaved repeats; the spread is"
        " (max - min) / median\nof build+run over the repeats, the noise of this machine;"
        " dask's and threadpool's replay is a second first run"
    )
    heads = ("build", "first run", "build+run", "replay", "inline replay")
    for label, row in ov.items():
        seq = row["sequential"]
        print(
            f"\n  {label} ({row['tasks']:,} tasks); sequential loop "
            f"{seq['run']:.2f} ({seq['run_min']:.2f})"
        )
        print(f"    {'':<17}" + "".join(f"{c:>17}" for c in heads) + "  [build+run spread]")
        for name in SYSTEMS:
            r = row[name]
            cells = "".join(
                f"{r[k]:>8.2f} ({r[k + '_min']:>6.2f})" if k in r else f"{'':>17}" for k in PHASES
            )
            print(f"    {name[:17]:<17}{cells}  [{r['build_run_spread']:.0%}]")
    st = ov["stencil 100x100"]

    def ratio(a, pa, b, pb):
        return {
            "median": st[a][pa] / st[b][pb],
            "min": st[a][pa + "_min"] / st[b][pb + "_min"],
        }

    ratios = {
        "dask_over_dagtrain_build_run": ratio("dask", "build_run", "dagtrain", "build_run"),
        "threadpool_over_dagtrain_build_run": ratio(
            "threadpool", "build_run", "dagtrain", "build_run"
        ),
        "dagtrain_over_minimal_build_run": ratio("dagtrain", "build_run", "minimal", "build_run"),
        "dagtrain_threaded_over_minimal_build_run": ratio(
            "dagtrain-threaded", "build_run", "minimal", "build_run"
        ),
        "dagtrain_over_minimal_build": ratio("dagtrain", "build", "minimal", "build"),
        "dask_over_dagtrain_replay": ratio("dask", "replay", "dagtrain", "replay"),
        "dask_over_dagtrain_inline_replay": ratio("dask", "replay", "dagtrain", "replay_inline"),
        "dagtrain_inline_replay_over_minimal_replay": ratio(
            "dagtrain", "replay_inline", "minimal", "replay"
        ),
    }
    print("\n  stencil 100x100 ratios, this run: median (from minima)")
    for k, v in ratios.items():
        print(f"    {k:<44}{v['median']:6.1f}x ({v['min']:.1f}x)")

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
