"""Static schedules of dagtrain.taskgraph.analysis.schedule vs anrg-saga's HEFT and CPoP.

    make bench-schedule     (runs in .venv-saga: saga is never a dependency of dagtrain)

Random DAGs (log-uniform 50-1000 tasks, varied width and density, communication-to-
computation ratio log-uniform 0.1-10, 2-8 processors of different speeds joined by
links of different strengths) are scheduled three ways on the same instance, in saga's
related-machines model (run time = cost / speed, transfer = size / link strength, none
on one processor): saga's HeftScheduler, saga's CpopScheduler, and our ``plan(...,
"best")``. Every schedule of ours is loaded into a saga ``Schedule`` (whose add_task
rejects overlaps) and checked against saga's own task graph and network for
precedence and transfer times before its makespan counts.

Prints makespan ratios and the schedule length ratio (SLR: makespan over the critical
path of minimal execution times); writes benchmarks/results/schedule_vs_saga.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from saga import Network, Schedule, ScheduledTask, TaskGraph  # noqa: E402
from saga.schedulers.cpop import CpopScheduler  # noqa: E402
from saga.schedulers.heft import HeftScheduler  # noqa: E402

from dagtrain.taskgraph.analysis.schedule import Problem, plan  # noqa: E402

logging.disable(logging.WARNING)  # saga warns about super sources; ours have one


def instance(rng: random.Random) -> dict:
    n = round(math.exp(rng.uniform(math.log(50), math.log(1000))))
    width = math.exp(rng.uniform(math.log(2), math.log(64)))  # tasks per layer
    layers = max(2, min(n, round(n / width)))
    per = [n // layers + (1 if k < n % layers else 0) for k in range(layers)]
    density = rng.choice([0.05, 0.15, 0.3])
    ids, start = [], 0
    for w in per:
        ids.append(list(range(start, start + w)))
        start += w
    edges = set()
    for k in range(1, layers):
        prev = ids[k - 1] + (ids[k - 2] if k >= 2 and rng.random() < 0.3 else [])
        p = min(density, 6.0 / len(prev))
        for j in ids[k]:
            parents = [i for i in prev if rng.random() < p] or [rng.choice(ids[k - 1])]
            edges.update((i, j) for i in parents)
    # one source and one sink (zero cost, zero data), as saga would add them
    src, snk = n, n + 1
    has_pred = {j for _, j in edges}
    has_succ = {i for i, _ in edges}
    edges.update((src, j) for j in range(n) if j not in has_pred)
    edges.update((i, snk) for i in range(n) if i not in has_succ)
    costs = [rng.uniform(1, 100) for _ in range(n)] + [0.0, 0.0]
    P = rng.randint(2, 8)
    speeds = [rng.uniform(1, 4) for _ in range(P)]
    bw = [[math.inf] * P for _ in range(P)]
    for a in range(P):
        for b in range(a + 1, P):
            bw[a][b] = bw[b][a] = rng.uniform(1, 4)
    ccr = math.exp(rng.uniform(math.log(0.1), math.log(10)))
    raw = {e: rng.uniform(0.5, 1.5) for e in sorted(edges)}
    real = [e for e in raw if src not in e and snk not in e]
    mean_exec = statistics.fmean(costs[:n]) * statistics.fmean(1 / s for s in speeds)
    inv = [1 / bw[a][b] for a in range(P) for b in range(P) if a != b]
    mean_comm = statistics.fmean(raw[e] for e in real) * statistics.fmean(inv) if real else 1
    scale = ccr * mean_exec / mean_comm
    data = [(i, j, 0.0 if i == src or j == snk else raw[(i, j)] * scale) for (i, j) in raw]
    return {
        "n": n + 2,
        "costs": costs,
        "edges": data,
        "speeds": speeds,
        "bw": bw,
        "ccr": ccr,
        "P": P,
        "layers": layers,
        "density": density,
    }


def to_saga(inst: dict) -> tuple[Network, TaskGraph]:
    P = inst["P"]
    net = Network.create(
        [(f"p{k}", inst["speeds"][k]) for k in range(P)],
        [(f"p{a}", f"p{b}", inst["bw"][a][b]) for a in range(P) for b in range(a + 1, P)],
    )
    tg = TaskGraph.create(
        [(f"t{i}", c) for i, c in enumerate(inst["costs"])],
        [(f"t{i}", f"t{j}", d) for i, j, d in inst["edges"]],
    )
    return net, tg


def check_with_saga(s, net: Network, tg: TaskGraph) -> float:
    """Load our plan into saga's Schedule (rejects overlaps), check precedence and
    transfers with saga's own model, and return saga's makespan of it."""
    sched = Schedule(tg, net)
    for i, (p, st, en) in enumerate(zip(s.proc, s.start, s.end)):
        sched.add_task(ScheduledTask(node=f"p{p}", name=f"t{i}", start=st, end=en))
    for task in tg.tasks:
        mine = sched.get_scheduled_task(task.name)
        node = net.get_node(mine.node)
        if abs((mine.end - mine.start) - task.cost / node.speed) > 1e-6 * max(1, mine.end):
            raise AssertionError(f"{task.name}: duration is not cost/speed")
        for dep in tg.in_edges(task.name):
            parent = sched.get_scheduled_task(dep.source)
            arrive = parent.end + dep.size / net.get_edge(parent.node, mine.node).speed
            if mine.start < arrive - 1e-6 * max(1, arrive):
                raise AssertionError(f"{task.name} starts before {dep.source}'s data arrives")
    return sched.makespan


def slr(inst: dict, makespan: float) -> float:
    """Makespan over the critical path of minimal execution times (no communication)."""
    best = [c / max(inst["speeds"]) for c in inst["costs"]]
    succ: dict[int, list[int]] = {}
    for i, j, _ in inst["edges"]:
        succ.setdefault(i, []).append(j)
    pb = Problem(inst["costs"], inst["edges"], inst["speeds"], inst["bw"])
    rank = [0.0] * inst["n"]
    for i in reversed(pb.order):
        rank[i] = best[i] + max((rank[j] for j in succ.get(i, [])), default=0.0)
    return makespan / max(rank)


def lower_bound(inst: dict) -> float:
    """max(critical path at the fastest speed without transfers, work / total speed)."""
    return Problem(inst["costs"], inst["edges"], inst["speeds"], inst["bw"]).lower_bound()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=120)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=str(HERE / "results" / "schedule_vs_saga.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    t_all = time.time()
    for k in range(args.instances):
        inst = instance(rng)
        net, tg = to_saga(inst)
        heft = HeftScheduler().schedule(net, tg).makespan
        cpop = CpopScheduler().schedule(net, tg).makespan
        pb = Problem(inst["costs"], inst["edges"], inst["speeds"], inst["bw"])
        t = time.time()
        ours = plan(pb, "best")
        took = time.time() - t
        ours_heft = plan(pb, "heft")
        mk = check_with_saga(ours, net, tg)
        rows.append(
            {
                "n": inst["n"],
                "P": inst["P"],
                "ccr": round(inst["ccr"], 3),
                "layers": inst["layers"],
                "density": inst["density"],
                "edges": len(inst["edges"]),
                "heft": heft,
                "cpop": cpop,
                "ours": mk,
                "ours_method": ours.method,
                "our_heft": ours_heft.makespan,
                "seconds": took,
                "slr_ours": slr(inst, mk),
                "slr_heft": slr(inst, heft),
                "slr_cpop": slr(inst, cpop),
                "lower_bound": lower_bound(inst),
            }
        )
        if (k + 1) % 20 == 0:
            print(f"  {k + 1} instances, {time.time() - t_all:.0f} s", flush=True)

    mean = statistics.fmean
    summary = {
        "instances": len(rows),
        "mean_ratio_vs_heft": mean(r["ours"] / r["heft"] for r in rows),
        "mean_ratio_vs_cpop": mean(r["ours"] / r["cpop"] for r in rows),
        "mean_ratio_vs_best_of_heft_cpop": mean(
            r["ours"] / min(r["heft"], r["cpop"]) for r in rows
        ),
        "mean_makespan": {
            "ours": mean(r["ours"] for r in rows),
            "heft": mean(r["heft"] for r in rows),
            "cpop": mean(r["cpop"] for r in rows),
            "best_of_heft_cpop": mean(min(r["heft"], r["cpop"]) for r in rows),
        },
        "mean_slr": {
            "ours": mean(r["slr_ours"] for r in rows),
            "heft": mean(r["slr_heft"] for r in rows),
            "cpop": mean(r["slr_cpop"] for r in rows),
        },
        "mean_heft_over_lower_bound": mean(r["heft"] / r["lower_bound"] for r in rows),
        "mean_ours_over_lower_bound": mean(r["ours"] / r["lower_bound"] for r in rows),
        "worse_than_heft": sum(r["ours"] > r["heft"] + 1e-9 for r in rows),
        "our_heft_vs_saga_heft": mean(r["our_heft"] / r["heft"] for r in rows),
        "winning_method": {
            m: sum(r["ours_method"] == m for r in rows)
            for m in sorted({r["ours_method"] for r in rows})
        },
        "mean_seconds": mean(r["seconds"] for r in rows),
        "max_seconds": max(r["seconds"] for r in rows),
    }
    print(
        f"\nstatic schedules on {len(rows)} random DAGs "
        f"({min(r['n'] for r in rows)}-{max(r['n'] for r in rows)} tasks, "
        f"CCR {min(r['ccr'] for r in rows):.2f}-{max(r['ccr'] for r in rows):.1f}, "
        f"2-8 processors), checked with saga's model"
    )
    print(
        f"  mean makespan ratio, ours / saga HEFT:            {summary['mean_ratio_vs_heft']:.3f}"
    )
    print(
        f"  mean makespan ratio, ours / saga CPoP:            {summary['mean_ratio_vs_cpop']:.3f}"
    )
    print(
        f"  mean ratio, ours / better of HEFT and CPoP:       "
        f"{summary['mean_ratio_vs_best_of_heft_cpop']:.3f}"
    )
    mm = summary["mean_makespan"]
    print(
        f"  mean makespan: ours {mm['ours']:.1f}, HEFT {mm['heft']:.1f}, CPoP {mm['cpop']:.1f},"
        f" better of the two {mm['best_of_heft_cpop']:.1f}"
    )
    sl = summary["mean_slr"]
    print(f"  mean SLR: ours {sl['ours']:.3f}, HEFT {sl['heft']:.3f}, CPoP {sl['cpop']:.3f}")
    print(
        f"  mean makespan / lower bound: ours {summary['mean_ours_over_lower_bound']:.3f}, "
        f"HEFT {summary['mean_heft_over_lower_bound']:.3f}"
    )
    print(f"  instances where ours is worse than saga HEFT: {summary['worse_than_heft']}")
    print(
        f"  our own HEFT / saga HEFT (same algorithm, a check): "
        f"{summary['our_heft_vs_saga_heft']:.3f}"
    )
    print(f"  best candidate per instance: {summary['winning_method']}")
    print(
        f"  planning time: mean {summary['mean_seconds']:.2f} s, max {summary['max_seconds']:.2f} s"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "summary": summary,
                "seed": args.seed,
                "date": time.strftime("%Y-%m-%d"),
                "instances": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
