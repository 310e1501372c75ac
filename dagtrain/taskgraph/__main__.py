"""A simulated training step on the executor: ``python -m dagtrain.taskgraph``.

The ops of one data-parallel step, with durations that stand in for real work (they
sleep, which releases the GIL as torch ops and collectives do):

    load next batch ─────────────────────────────────────────────┐ (prefetch)
    forward ─ backward[3] ─ backward[2] ─ backward[1] ─ backward[0]
                  │              │              │             │
             allreduce[3]   allreduce[2]   allreduce[1]   allreduce[0]   (async: detach)
                  │              │              │             │
              update[3]      update[2]      update[1]     update[0]
                  └──────────────┴── snapshot ─┴─────────────┘ ── write (background)

The graph is built once and replayed each step. It prints the step time against the
same ops run one after another, the critical path, and writes a Perfetto trace.
"""

from __future__ import annotations

import argparse
import threading
import time

from . import Event, TaskGraph

MS = 1e-3


def build_step(buckets: int, scale: float) -> TaskGraph:
    g = TaskGraph("train-step")
    d = {"load": 20, "fwd": 30, "bwd": 12, "comm": 15, "upd": 3, "snap": 4, "write": 25}
    d = {k: v * MS * scale for k, v in d.items()}

    def comm(event: Event, seconds: float) -> None:
        # an async allreduce: returns at once; the "network" fulfils the event later
        threading.Timer(seconds, event.fulfill).start()

    g.add(time.sleep, d["load"], name="load-next", out="next-batch", cost=d["load"])
    g.add(
        time.sleep,
        d["fwd"],
        name="forward",
        in_=[f"params{k}" for k in range(buckets)],
        out="act",
        cost=d["fwd"],
    )
    for k in reversed(range(buckets)):
        g.add(
            time.sleep, d["bwd"], name=f"backward[{k}]", inout="act", out=f"grad{k}", cost=d["bwd"]
        )
        g.add(
            comm,
            seconds=d["comm"],
            name=f"allreduce[{k}]",
            inout=f"grad{k}",
            detach=True,
            cost=d["comm"],
        )
        g.add(
            time.sleep,
            d["upd"],
            name=f"update[{k}]",
            in_=f"grad{k}",
            inout=f"params{k}",
            cost=d["upd"],
        )
    g.add(
        time.sleep,
        d["snap"],
        name="snapshot",
        in_=[f"params{k}" for k in range(buckets)],
        out="snapshot",
        cost=d["snap"],
    )
    g.add(time.sleep, d["write"], name="write", in_="snapshot", cost=d["write"])
    return g


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dagtrain.taskgraph", description=__doc__)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every duration")
    ap.add_argument("--trace", default="trace_step.json")
    args = ap.parse_args(argv)

    g = build_step(args.buckets, args.scale)
    serial = sum(t.cost for t in g.tasks)
    path, length = g.critical_path()
    times = []
    for step in range(args.steps):
        report = g.run(workers=args.workers, trace=args.trace if step == args.steps - 1 else None)
        times.append(report.makespan)
    best = min(times)
    print(f"{len(g)} ops per step, {args.workers} workers, {args.steps} steps (replayed)")
    print(f"  one op after another:     {serial * 1e3:7.1f} ms")
    print(f"  graph, best step:         {best * 1e3:7.1f} ms   ({serial / best:.2f}x faster)")
    print(f"  lower bound:              {g.lower_bound(args.workers) * 1e3:7.1f} ms")
    print(f"  critical path ({length * 1e3:.1f} ms): " + " -> ".join(t.name for t in path))
    print(f"  utilisation of the last step: {report.utilisation:.0%}")
    print(f"  trace: {args.trace} (open it at https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
