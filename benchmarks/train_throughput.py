"""Training throughput of dagtrain against PyTorch DDP and Horovod, in one run.

    .venv/bin/python benchmarks/train_throughput.py [--steps 30] [--repeats 3] [--quick]

Same model, data (digits), global batch, steps, 2 ranks on CPU, one intra-op thread per
rank (2 ranks share 2 cores here):

  dagtrain overlap    our step graph with overlap on (the default: bucketed allreduce
                      overlapping backward, run while rank 0 measures it faster than the
                      plain step: a trial in the first steps, then reviews with probes;
                      a model with one bucket runs the plain step),
                      on gloo (torch.distributed: the same transport as DDP)
  dagtrain plain      overlap off: backward, then allreduce everything, then step
  dagtrain overlap mpi  overlap on, on mpi4py under mpirun
  dagtrain plain mpi    its plain step
  ddp                 torch DistributedDataParallel (gloo, default 25 MB buckets), torchrun
  horovod             horovod.torch.DistributedOptimizer under mpirun

Every system's step time includes cutting its batch out of the dataset (dagtrain's
prefetch task does it inside the step).

Two models: a communication-heavy MLP (about 21M parameters in six equal layers, so
buckets come ready one by one during backward) and the compute-heavy residual CNN.
Prints samples/s (median step) and ratios, and, from rank 0's trace of dagtrain's last
step, the fraction of allreduce time that ran hidden under forward+backward, and whether
the overlapped step was kept (its trace has one allreduce per bucket).
Writes benchmarks/results/train_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dagtrain.launch import launch  # noqa: E402
from dagtrain.training import TrainConfig, run_training  # noqa: E402

MODELS = {
    "mlp-21M": {"model": "mlp", "model_args": {"hidden": [2048] * 6}},
    "rescnn": {"model": "rescnn", "model_args": {"channels": 48, "blocks": 4}},
}
NPROCS = 2
BATCH = 64
WARMUP = 5


def baseline(kind: str, model: dict, steps: int, out: Path) -> float:
    """Median step seconds of DDP (torchrun) or Horovod (mpirun); see _baseline.py."""
    spec = json.dumps({"kind": kind, "steps": steps + WARMUP, "batch": BATCH, **model})
    launcher = "torchrun" if kind == "ddp" else "mpirun"
    launch(
        ["benchmarks._baseline", spec, str(out)],
        NPROCS,
        launcher,
        on_line=lambda line: None,
        timeout=1800,
    )
    times = json.loads(out.read_text())["step_seconds"][WARMUP:]
    return statistics.median(times)


def ours(
    model: dict, steps: int, overlap: bool, trace_dir: str, backend: str = "torch"
) -> tuple[float, float | None, bool | None]:
    """Median step seconds; with overlap on, the share of allreduce time hidden in the
    last step and whether that step was the overlapped one (None with overlap off)."""
    cfg = TrainConfig(
        backend=backend,
        epochs=100,
        max_steps=steps + WARMUP,
        batch_size=BATCH,
        lr=0.01,
        overlap=overlap,
        trace_dir=trace_dir if overlap else None,
        workers=2,
        intra_op_threads=1,
        collective_timeout=600,
        **model,
    )
    r = run_training(cfg, NPROCS, on_line=lambda line: None, timeout=1800)
    trace = Path(trace_dir) / "step-rank0.json"
    hidden = _hidden(trace) if overlap else None
    kept = _overlapped(trace) if overlap else None
    return statistics.median(r.step_seconds[WARMUP:]), hidden, kept


def _overlapped(trace: Path) -> bool | None:
    """Whether the traced step was the overlapped one (one allreduce task per bucket)."""
    if not trace.exists():
        return None
    ev = json.loads(trace.read_text())["traceEvents"]
    return any(e["ph"] == "X" and e["name"].startswith("allreduce[") for e in ev)


def _hidden(trace: Path) -> float | None:
    """Share of allreduce time that overlapped forward+backward in the traced step."""
    if not trace.exists():
        return None
    ev = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    fb = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "forward-backward"]
    ar = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("allreduce")]
    total = sum(b - a for a, b in ar)
    if not fb or total <= 0:
        return None
    f0, f1 = fb[0]
    return sum(max(0.0, min(b, f1) - max(a, f0)) for a, b in ar) / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="8 steps, for a smoke run")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds over all runtimes, interleaved; the median round counts",
    )
    ap.add_argument("--out", default=str(HERE / "results" / "train_throughput.json"))
    args = ap.parse_args()
    steps = 8 if args.quick else args.steps
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {}
    print(
        f"{NPROCS} ranks on {os.cpu_count()} CPUs, global batch {BATCH}, {steps} steps "
        f"after {WARMUP} warm-up; samples/s of the median step"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in MODELS.items():
            # rounds interleave the runtimes, so a slow spell of this shared machine
            # hits them alike; each runtime's median round is reported
            rounds: dict[str, list[float]] = {}
            hiddens = []
            kept: dict[str, list[bool | None]] = {}
            for _ in range(1 if args.quick else args.repeats):
                sec, hidden, on = ours(model, steps, True, tmp)
                rounds.setdefault("dagtrain overlap", []).append(sec)
                hiddens.append(hidden)
                kept.setdefault("dagtrain overlap", []).append(on)
                rounds.setdefault("dagtrain plain", []).append(ours(model, steps, False, tmp)[0])
                sec, _, on = ours(model, steps, True, tmp + "/mpi", "mpi")
                rounds.setdefault("dagtrain overlap mpi", []).append(sec)
                kept.setdefault("dagtrain overlap mpi", []).append(on)
                rounds.setdefault("dagtrain plain mpi", []).append(
                    ours(model, steps, False, tmp + "/mpi", "mpi")[0]
                )
                rounds.setdefault("ddp", []).append(
                    baseline("ddp", model, steps, Path(tmp) / "ddp.json")
                )
                rounds.setdefault("horovod", []).append(
                    baseline("horovod", model, steps, Path(tmp) / "hvd.json")
                )
            hidden = (
                statistics.median(h for h in hiddens if h is not None)
                if any(h is not None for h in hiddens)
                else None
            )
            sps = {k: BATCH / statistics.median(v) for k, v in rounds.items()}
            ratios = {
                "overlap_vs_ddp": sps["dagtrain overlap"] / sps["ddp"],
                "overlap_vs_horovod": sps["dagtrain overlap"] / sps["horovod"],
                "overlap_vs_plain": sps["dagtrain overlap"] / sps["dagtrain plain"],
                "overlap_vs_plain_mpi": sps["dagtrain overlap mpi"] / sps["dagtrain plain mpi"],
                "best_vs_ddp": max(sps["dagtrain overlap"], sps["dagtrain overlap mpi"])
                / sps["ddp"],
                "best_vs_horovod": max(sps["dagtrain overlap"], sps["dagtrain overlap mpi"])
                / sps["horovod"],
            }
            results[name] = {
                "samples_per_s": sps,
                "rounds_samples_per_s": {k: [BATCH / x for x in v] for k, v in rounds.items()},
                "ratios": ratios,
                "allreduce_hidden_fraction": hidden,
                "overlap_kept": kept,
            }
            print(f"\n{name}")
            for k, v in sps.items():
                print(f"  {k:<18}{v:9.1f} samples/s")
            print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
            if hidden is not None:
                print(f"  allreduce time hidden under forward+backward: {hidden:.0%}")
            for k, v in kept.items():
                shown = ["-" if x is None else "overlapped" if x else "plain" for x in v]
                print(f"  {k}: the step kept in each round: {', '.join(shown)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "ranks": NPROCS,
                "cpus": os.cpu_count(),
                "batch": BATCH,
                "steps": steps,
                "warmup": WARMUP,
                "repeats": 1 if args.quick else args.repeats,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
