"""dagtrain's Adam (torch's, its step in slices: dagtrain/training/rank/optimizers.py)
against torch.optim.Adam: the time of one step and the memory a step adds.

    .venv/bin/python benchmarks/adam_step.py [--rounds 5] [--steps 10]

Time: the parameters of the throughput benchmarks' MLP (21M parameters in six hidden
layers of 2048), random gradients, each optimizer
stepping ``--steps`` times after one untimed step (which makes the state), in
alternating rounds, at 1 and at 2 intra-op threads; the median step of each. Both give
the same parameters, bit for bit (checked here at each setting).

Memory: one 8192x8192 parameter (256 MiB), in a fresh process per optimizer: the peak
resident memory of its second step above the resident memory before it (VmHWM after
resetting it through /proc/self/clear_refs).

Writes benchmarks/results/adam_step.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# the throughput benchmarks' MLP (mlp-21M: six hidden layers of 2048, on digits' 64
# inputs): its parameters' shapes
SHAPES = [(2048, 64), (2048,)] + [(2048, 2048), (2048,)] * 5 + [(10, 2048), (10,)]


def memory_child(which: str) -> None:
    import torch

    from dagtrain.training.rank.optimizers import Adam

    cls = Adam if which == "dagtrain" else torch.optim.Adam
    p = torch.nn.Parameter(torch.randn(8192, 8192))
    p.grad = torch.randn(8192, 8192)
    opt = cls([p], lr=1e-3)
    opt.step()  # the state

    def status(key: str) -> int:
        text = Path("/proc/self/status").read_text()
        return int(text.split(key + ":")[1].split()[0]) * 1024

    before = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    opt.step()
    print(json.dumps({"step_adds_bytes": status("VmHWM") - before}))


def timing(threads: int, rounds: int, steps: int) -> dict[str, float]:
    import torch

    from dagtrain.training.rank.optimizers import Adam

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    init = [torch.randn(s) for s in SHAPES]
    grads = [torch.randn(s) for s in SHAPES]
    made = {}
    for name, cls in (("torch", torch.optim.Adam), ("dagtrain", Adam)):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g
        made[name] = (ps, cls(ps, lr=1e-3))
    times: dict[str, list[float]] = {"torch": [], "dagtrain": []}
    for _ in range(rounds):
        for name, (_, opt) in made.items():
            opt.step()  # untimed: the state, the caches
            for _ in range(steps):
                t0 = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - t0)
    same = all(torch.equal(a, b) for a, b in zip(made["torch"][0], made["dagtrain"][0]))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return {
        "threads": threads,
        "torch_ms": round(med["torch"], 2),
        "dagtrain_ms": round(med["dagtrain"], 2),
        "speedup": round(med["torch"] / med["dagtrain"], 2),
        "same_parameters": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--memory-child")
    a = ap.parse_args()
    if a.memory_child:
        memory_child(a.memory_child)
        return
    rows = [timing(t, a.rounds, a.steps) for t in (1, 2)]
    for r in rows:
        print(
            f"{r['threads']} thread(s): torch.optim.Adam {r['torch_ms']} ms, dagtrain's "
            f"{r['dagtrain_ms']} ms a step ({r['speedup']}x); the same parameters: "
            f"{r['same_parameters']}"
        )
    memory = {}
    for which in ("torch", "dagtrain"):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", which],
            capture_output=True, text=True, check=True, timeout=600,
        ).stdout  # fmt: skip
        memory[which] = json.loads(out.strip().splitlines()[-1])["step_adds_bytes"]
        print(f"an 8192x8192 parameter's step adds {memory[which] / 2**20:.0f} MiB ({which})")
    out = {
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": "benchmarks/adam_step.py " + " ".join(sys.argv[1:]),
        "parameters": sum(math.prod(s) for s in SHAPES),
        "timing": rows,
        "memory_step_adds_bytes": memory,
        "notes": [
            "timing: the median step over rounds x steps, the optimizers in alternating rounds",
            "memory: VmHWM of the second step above VmRSS before it, one 256 MiB parameter",
        ],
    }
    path = HERE / "results" / "adam_step.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
