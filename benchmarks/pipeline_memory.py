"""Memory per rank of a pipeline: each stage holds its own blocks only.

    .venv/bin/python benchmarks/pipeline_memory.py [--width 8192] [--steps 3]
        [--cap-gb 3.0]

The model: the built-in ``mlp`` on digits with five hidden layers of ``--width`` (8192:
four 8192x8192 layers, 269M parameters, 1.07 GB of fp32 weights; with their gradients
and Adam's two moments 4.3 GB), trained with Adam for ``--steps`` steps of 32 samples,
one intra-op thread per rank, on S = 1 (one process, the whole model), 2 and 4 stages
(torch backend, gloo; the split puts one big layer per stage at S = 4, two at S = 2:
``parallel.split`` [7] and [5, 7, 9]), without checkpoints.

Per rank: the peak resident memory (``VmHWM`` of /proc/<pid>/status, read every 0.1 s
while the rank runs). The fixed overhead is the same run's with a width of 64 (what a
rank holds besides the model's state: the interpreter, torch, the data, threads); the
state per rank is 16 bytes per parameter of the stage (weights, gradients, Adam's
``exp_avg`` and ``exp_avg_sq``, fp32). The figure the issue sets: (peak - overhead) /
(whole model's state / S) at most 1.2. Printed beside it, the same with one gradient of
the stage's largest weight counted in the overhead: autograd makes a microbatch's
gradient of a weight before adding it into the one accumulated, so a rank holds one
such transient at the peak; its size is the model's largest tensor's, not a share of S
(at S = 4 here, one 8192x8192 layer per stage, it is a quarter of the stage's state).

Then the cap: every process of a run under ``resource.setrlimit(RLIMIT_DATA,
--cap-gb)`` (set in the run's process before it starts the ranks; they inherit it), the
whole model on one process (which needs more) and the same model on 4 stages.

Then checkpoints: 4 stages checkpointing after every step, with each
``training.checkpoint_write``: ``background`` (each writing rank copies its stage's
parameters and optimizer state and writes the copy while training goes on) and
``inline`` (written from the live state while the rank waits): each one's peak, each
under the cap, and one step more resumed from the inline run's checkpoint under the cap.

Writes benchmarks/results/pipeline_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SPLITS = {1: None, 2: [7], 4: [5, 7, 9]}  # blocks: Flatten, (Linear, ReLU) x 5, Linear


def config(
    width: int, stages: int, steps: int, ckpt: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The run; ``ckpt``: (a directory, ``checkpoint_write``) to checkpoint every step."""
    cfg: dict[str, Any] = {
        "model": {"name": "mlp", "args": {"hidden": [width] * 5}, "max_parameters": 10**10},
        "optimizer": "adam",
        "lr": 1e-4,
        "epochs": 1,
        "max_steps": steps,
        "batch_size": 32,
        "intra_op_threads": 1,
        "collective_timeout": 600,
    }
    if ckpt:
        cfg |= {
            "checkpoint_dir": ckpt[0],
            "checkpoint_write": ckpt[1],
            "checkpoint_every": 1,
            "keep_checkpoints": 1,
        }
    if stages > 1:
        cfg |= {
            "backend": "torch",
            "ranks": stages,
            "parallel": {"stages": stages, "microbatches": 2, "split": SPLITS[stages]},
        }
    return cfg


def child(spec: str, cap: int | None) -> None:
    """One run, in this process, under ``cap`` bytes of RLIMIT_DATA (the ranks it
    starts inherit it): its result as JSON."""
    if cap:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    from dagtrain.training import TrainConfig, run_training

    args = json.loads(spec)
    try:
        r = run_training(TrainConfig(**args), 1 if "ranks" not in args else None,
                         on_line=lambda line: None)  # fmt: skip
        out = {
            "ok": True,
            "steps": r.steps,
            "resumed_from_step": r.resumed_from_step,
            "params_sha256": r.params_sha256,
        }
    except Exception as e:  # the cap's run fails: say how
        out = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    print("RESULT " + json.dumps(out), flush=True)


def hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run(
    width: int,
    stages: int,
    steps: int,
    cap: int | None = None,
    ckpt: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One run in a fresh process tree; the peak resident bytes of each rank."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DAGTRAIN_PID_DIR": tmp, "OMP_NUM_THREADS": "1"}

        spec = json.dumps(config(width, stages, steps, ckpt))
        t0 = time.monotonic()
        log = Path(tmp) / "out.log"
        with log.open("w") as sink:  # (a pipe would fill while the parent polls)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", spec, "--cap", str(cap or 0)],
                env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            peaks: dict[int, int] = {}
            while proc.poll() is None:
                for f in Path(tmp).glob("rank*.pid"):
                    rank = int(f.stem.removeprefix("rank") or 0)
                    got = hwm(int(f.read_text() or 0))
                    if got:
                        peaks[rank] = max(peaks.get(rank, 0), got)
                time.sleep(0.1)
        out = log.read_text()
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    result = json.loads(line[7:]) if line else {"ok": False, "error": out[-500:]}
    return {
        "stages": stages,
        "width": width,
        "cap_bytes": cap,
        "seconds": round(time.monotonic() - t0, 1),
        "peak_rss_bytes": [peaks.get(r) for r in range(stages)],
        **result,
    }


def stage_params(width: int) -> dict[int, list[tuple[int, int]]]:
    """(parameters, the largest's elements) per stage of each split (the mlp's Linear
    layers)."""
    import torch

    from dagtrain.training.rank.models import mlp
    from dagtrain.training.rank.split import Split, blocks_of

    with torch.device("meta"):
        model = mlp((64,), 10, hidden=[width] * 5)
    blocks = blocks_of(model)
    per = {}
    for s, bounds in SPLITS.items():
        split = Split(bounds or [], len(blocks), "explicit")
        per[s] = [
            (
                sum(q.numel() for b in blocks[a:c] for q in b.parameters()),
                max((q.numel() for b in blocks[a:c] for q in b.parameters()), default=0),
            )
            for a, c in split.ranges
        ]
    return per


def checkpointing(a: argparse.Namespace, cap: int) -> dict[str, Any]:
    """4 stages checkpointing after every step, each way of ``checkpoint_write``: the
    peak per rank, then the same under the cap, then (inline) one more step resumed
    from its checkpoint under the cap (a resume reads a rank's stage out of it)."""
    out: dict[str, Any] = {}
    for mode in ("background", "inline"):
        with tempfile.TemporaryDirectory() as d:
            out[mode] = run(a.width, 4, a.steps, None, (d, mode))
        with tempfile.TemporaryDirectory() as d:
            out[f"{mode}, capped"] = run(a.width, 4, a.steps, cap, (d, mode))
            if mode == "inline":
                out["inline, capped, resumed"] = run(a.width, 4, a.steps + 1, cap, (d, mode))
    for what, r in out.items():
        gib = [round(p / 2**30, 2) if p else None for p in r["peak_rss_bytes"]]
        how = "trained" if r["ok"] else r["error"]
        if r.get("resumed_from_step"):
            how += f" (resumed from step {r['resumed_from_step']})"
        print(f"S=4, a checkpoint every step, {what}: {how}; peak per rank {gib} GiB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cap-gb", type=float, default=3.0)
    ap.add_argument("--child")
    ap.add_argument("--cap", type=int, default=0)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.cap)
        return
    per = stage_params(a.width)
    whole = sum(n for n, _ in per[1]) * 16  # bytes: weights, gradients, Adam's moments
    rows = []
    for s in (1, 2, 4):
        small = run(64, s, a.steps)
        big = run(a.width, s, a.steps)
        overhead = max(x for x in small["peak_rss_bytes"] if x)
        peaks = big["peak_rss_bytes"]
        ratios = [round((p - overhead) / (whole / s), 3) if p else None for p in peaks]
        beyond = [
            round((p - overhead - 4 * most) / (whole / s), 3) if p else None
            for p, (_, most) in zip(peaks, per[s])
        ]
        rows.append(
            {
                **big,
                "overhead_bytes": overhead,
                "stage_state_bytes": [n * 16 for n, _ in per[s]],
                "whole_state_bytes": whole,
                "ratio_to_whole_over_s": ratios,
                "largest_gradient_bytes": [4 * most for _, most in per[s]],
                "ratio_beyond_one_largest_gradient": beyond,
                "overhead_run": small,
            }
        )
        gib = [round(p / 2**30, 2) if p else None for p in big["peak_rss_bytes"]]
        print(
            f"S={s}: peak per rank {gib} GiB, "
            f"overhead {overhead / 2**30:.2f} GiB, (peak - overhead) / (state / S) {ratios}, "
            f"with one gradient of the largest weight in the overhead {beyond}",
            flush=True,
        )
    cap = int(a.cap_gb * 2**30)
    capped = [run(a.width, 1, a.steps, cap), run(a.width, 4, a.steps, cap)]
    for c in capped:
        print(f"cap {a.cap_gb} GiB, S={c['stages']}: {'trained' if c['ok'] else c['error']}")
    checkpoints = checkpointing(a, cap)
    out = {
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": "benchmarks/pipeline_memory.py " + " ".join(sys.argv[1:]),
        "parameters": sum(n for n, _ in per[1]),
        "rows": rows,
        "cap": {"gb": a.cap_gb, "runs": capped},
        "checkpoints": checkpoints,
        "notes": [
            "peak = VmHWM of each rank process; overhead = the same run's with width 64",
            "state = 16 bytes per parameter (fp32 weights, gradients, Adam exp_avg, exp_avg_sq)",
            "ratio_beyond_one_largest_gradient: the same ratio with one fp32 gradient of the "
            "stage's largest weight counted in the overhead (autograd's transient gradient of "
            "a microbatch before it is added into the accumulated one)",
            "Adam: dagtrain's (torch's, its step in 4 MiB slices: no parameter-sized "
            "temporaries); before it (torch's step) 1.20 / 1.26 / 1.50 at S = 1 / 2 / 4",
            "rows: no checkpoints; checkpoints: 4 stages checkpointing after every step, "
            "checkpoint_write background (a copy of each writing rank's state while it is "
            "written) and inline (written from the live state while the rank waits)",
        ],
    }
    path = HERE / "results" / "pipeline_memory.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
