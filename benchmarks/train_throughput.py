"""Training throughput of dagtrain against PyTorch DDP and Horovod, in one run.

    .venv/bin/python benchmarks/train_throughput.py [--steps 30] [--repeats 3] [--quick]
        [--models mlp-21M,rescnn,causal-lm]

Same model, data, global batch, loss, steps, 2 ranks on CPU, one intra-op thread per
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

Three models: a communication-heavy MLP (about 21M parameters in six equal layers, so
buckets come ready one by one during backward) and the compute-heavy residual CNN, both
on digits, global batch 64; and ``causal-lm``, the built-in transformer as a causal
language model (``objective: language_model``) on the windows of 64 bytes of
dags/data/corpus.txt, global batch 32 (2,048 tokens a step). Its size, dim 128, 4 heads,
4 layers (0.87M parameters, 3.5 MB of gradients: two buckets), is the one of
objectives' example; a step is ~110 ms on one core here (dim 256 would be ~580 ms, and a
round of the six systems 4 minutes). The baselines use dagtrain's windows, model
(``build_model`` with the data's ``DataInfo``) and loss (see _baseline.py).

Prints samples/s (median step; tokens/s too for the language model) and ratios; the same
from the fastest tenth of each system's steps over all rounds (on a shared machine, what
each does in the quiet spells, where a round's median mixes in whatever else ran); and,
from rank 0's trace of dagtrain's last step, the fraction of allreduce time that ran
hidden under forward+backward, whether the overlapped step was kept (its trace has one
allreduce per bucket), the last step's time per task (dagtrain) and the baselines'
median time per phase (batch, forward, backward, step), to see where time goes.
Writes benchmarks/results/train_throughput.json; with ``--models`` naming only some,
their entries replace those of the file and the others' are kept (each entry says when
it was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._results import out_help, results_path  # noqa: E402
from dagtrain.launch import launch  # noqa: E402
from dagtrain.training import TrainConfig, run_training  # noqa: E402

# TrainConfig shorthand of each model and its data (digits unless ``data`` says)
MODELS: dict[str, dict] = {
    "mlp-21M": {"model": "mlp", "model_args": {"hidden": [2048] * 6}},
    "rescnn": {"model": "rescnn", "model_args": {"channels": 48, "blocks": 4}},
    "causal-lm": {
        "model": "transformer",
        "model_args": {"dim": 128, "heads": 4, "layers": 4},
        "objective": "language_model",
        "data": str(HERE.parent / "dags" / "data" / "corpus.txt"),
        "sequence_length": 64,
    },
}
NPROCS = 2
BATCH = 64
BATCHES = {"causal-lm": 32}  # a model's global batch, where it is not BATCH
WARMUP = 5


def batch_of(name: str) -> int:
    """The global batch of model ``name``."""
    return BATCHES.get(name, BATCH)


def baseline(
    kind: str, model: dict, batch: int, steps: int, out: Path
) -> tuple[list[float], dict[str, float]]:
    """Rank 0's timed step seconds of DDP (torchrun) or Horovod (mpirun), and the median
    seconds of each of their phases; see _baseline.py."""
    spec = json.dumps({"kind": kind, "steps": steps + WARMUP, "batch": batch, **model})
    launcher = "torchrun" if kind == "ddp" else "mpirun"
    launch(
        ["benchmarks._baseline", spec, str(out)],
        NPROCS,
        launcher,
        on_line=lambda line: None,
        timeout=1800,
    )
    got = json.loads(out.read_text())
    phases = got["phase_seconds"][WARMUP:]
    per = {k: statistics.median(p[k] for p in phases) for k in phases[0]} if phases else {}
    return got["step_seconds"][WARMUP:], per


@dataclass
class Ours:
    """One run of dagtrain: its timed step seconds, and from rank 0's trace of its last
    step: the share of allreduce time hidden under forward+backward and whether that
    step was the overlapped one (both None with overlap off), and ms per task."""

    steps: list[float]
    hidden: float | None
    kept: bool | None
    tasks: dict[str, float] | None


def ours(
    model: dict, batch: int, steps: int, overlap: bool, trace_dir: str, backend: str = "torch"
) -> Ours:
    """dagtrain on ``model``; its last step traced into ``trace_dir``."""
    Path(trace_dir).mkdir(parents=True, exist_ok=True)
    for f in Path(trace_dir).glob("*.json"):
        f.unlink()
    cfg = TrainConfig(
        backend=backend,
        epochs=100,
        max_steps=steps + WARMUP,
        batch_size=batch,
        lr=0.01,
        overlap=overlap,
        trace_dir=trace_dir,
        workers=2,
        intra_op_threads=1,
        collective_timeout=600,
        **model,
    )
    r = run_training(cfg, NPROCS, on_line=lambda line: None, timeout=1800)
    trace = Path(trace_dir) / "step-rank0.json"
    return Ours(
        list(r.step_seconds[WARMUP:]),
        _hidden(trace) if overlap else None,
        _overlapped(trace) if overlap else None,
        _tasks(trace),
    )


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


def _tasks(trace: Path) -> dict[str, float] | None:
    """ms of each task of the traced step, and the step's span (``span``)."""
    if not trace.exists():
        return None
    ev = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    if not ev:
        return None
    out = {e["name"]: round(e["dur"] / 1e3, 3) for e in ev}
    out["span"] = round((max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1e3, 3)
    return out


# the systems of a round, in the order they run
SYSTEMS = (
    "dagtrain overlap",
    "dagtrain plain",
    "dagtrain overlap mpi",
    "dagtrain plain mpi",
    "ddp",
    "horovod",
)


def _round(
    model: dict, batch: int, steps: int, tmp: str
) -> dict[str, tuple[list[float], Ours | dict[str, float]]]:
    """One round: every system once, in SYSTEMS' order; each one's timed step seconds
    and its details (dagtrain: an Ours; a baseline: its phases)."""
    got: dict[str, tuple[list[float], Ours | dict[str, float]]] = {}
    for name in SYSTEMS:
        if name.startswith("dagtrain"):
            overlap, mpi = "overlap" in name, name.endswith("mpi")
            trace_dir = f"{tmp}/{name.replace(' ', '-')}"
            r = ours(model, batch, steps, overlap, trace_dir, "mpi" if mpi else "torch")
            got[name] = (r.steps, r)
        else:
            got[name] = baseline(name, model, batch, steps, Path(tmp) / f"{name}.json")
    return got


def measure(name: str, model: dict, steps: int, repeats: int, tmp: str) -> dict:
    """Every system on ``model``, ``repeats`` rounds; the figures of its entry."""
    batch = batch_of(name)
    tokens = model.get("sequence_length") or 0
    # rounds interleave the runtimes, so a slow spell of this shared machine hits them
    # alike; each runtime's median round is reported
    rounds: dict[str, list[float]] = {k: [] for k in SYSTEMS}  # median step of each
    every: dict[str, list[float]] = {k: [] for k in SYSTEMS}  # every timed step
    hiddens: list[float | None] = []
    kept: dict[str, list[bool | None]] = {"dagtrain overlap": [], "dagtrain overlap mpi": []}
    tasks: dict[str, list] = {k: [] for k in SYSTEMS if k.startswith("dagtrain")}
    phases: dict[str, list] = {"ddp": [], "horovod": []}
    loads = []
    Path(tmp).mkdir(parents=True, exist_ok=True)
    for _ in range(repeats):
        loads.append(os.getloadavg()[0])
        for k, (times, detail) in _round(model, batch, steps, tmp).items():
            rounds[k].append(statistics.median(times))
            every[k].extend(times)
            if isinstance(detail, Ours):
                tasks[k].append(detail.tasks)
                if k in kept:
                    kept[k].append(detail.kept)
                if k == "dagtrain overlap":
                    hiddens.append(detail.hidden)
            else:
                phases[k].append({p: round(v * 1e3, 3) for p, v in detail.items()})
    hidden = (
        statistics.median(h for h in hiddens if h is not None)
        if any(h is not None for h in hiddens)
        else None
    )
    sps = {k: batch / statistics.median(v) for k, v in rounds.items()}
    best = max(sps["dagtrain overlap"], sps["dagtrain overlap mpi"])
    ratios = {
        "overlap_vs_ddp": sps["dagtrain overlap"] / sps["ddp"],
        "overlap_vs_horovod": sps["dagtrain overlap"] / sps["horovod"],
        "overlap_vs_plain": sps["dagtrain overlap"] / sps["dagtrain plain"],
        "overlap_vs_plain_mpi": sps["dagtrain overlap mpi"] / sps["dagtrain plain mpi"],
        "best_vs_ddp": best / sps["ddp"],
        "best_vs_horovod": best / sps["horovod"],
        # MPI against Horovod, which runs on it (overlap_vs_ddp: gloo against DDP)
        "overlap_mpi_vs_horovod": sps["dagtrain overlap mpi"] / sps["horovod"],
    }
    # the fastest tenth of each system's steps over all rounds: what a system does in
    # the quiet spells of a shared machine (its median round mixes in the others' load)
    fast = {k: batch / _quantile(v, 0.1) for k, v in every.items()}
    best_fast = max(fast["dagtrain overlap"], fast["dagtrain overlap mpi"])
    ratios_fast = {
        "best_vs_ddp": best_fast / fast["ddp"],
        "best_vs_horovod": best_fast / fast["horovod"],
        "overlap_vs_ddp": fast["dagtrain overlap"] / fast["ddp"],
        "overlap_mpi_vs_horovod": fast["dagtrain overlap mpi"] / fast["horovod"],
        "plain_vs_ddp": fast["dagtrain plain"] / fast["ddp"],
        "plain_mpi_vs_horovod": fast["dagtrain plain mpi"] / fast["horovod"],
    }
    entry: dict = {
        "model": model,
        "batch": batch,
        "samples_per_s": sps,
        "rounds_samples_per_s": {k: [batch / x for x in v] for k, v in rounds.items()},
        "ratios": ratios,
        "samples_per_s_fastest_tenth": fast,
        "ratios_fastest_tenth": ratios_fast,
        "allreduce_hidden_fraction": hidden,
        "overlap_kept": kept,
        "dagtrain_last_step_ms_rank0": tasks,
        "baseline_phase_ms_rank0": phases,
        "measured": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "steps": steps,
            "warmup": WARMUP,
            "repeats": repeats,
            "load_average_at_round_starts": [min(loads), max(loads)],
        },
    }
    if tokens:
        entry["tokens_per_sample"] = tokens
        entry["tokens_per_s"] = {k: v * tokens for k, v in sps.items()}
    _report(name, entry)
    return entry


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (the nearest rank below)."""
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))]


def _report(name: str, entry: dict) -> None:
    tokens = entry.get("tokens_per_sample")
    print(f"\n{name} (global batch {entry['batch']})")
    for k, v in entry["samples_per_s"].items():
        spread = ", ".join(f"{x:.1f}" for x in entry["rounds_samples_per_s"][k])
        extra = f"{v * tokens:10.0f} tokens/s" if tokens else ""
        print(f"  {k:<22}{v:9.1f} samples/s{extra}  (rounds: {spread})")
    print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in entry["ratios"].items()))
    fast = entry["samples_per_s_fastest_tenth"]
    print("  fastest tenth of the steps: " + ", ".join(f"{k} {v:.1f}" for k, v in fast.items()))
    print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in entry["ratios_fastest_tenth"].items()))
    hidden = entry["allreduce_hidden_fraction"]
    if hidden is not None:
        print(f"  allreduce time hidden under forward+backward: {hidden:.0%}")
    for k, v in entry["overlap_kept"].items():
        shown = ["-" if x is None else "overlapped" if x else "plain" for x in v]
        print(f"  {k}: the step kept in each round: {', '.join(shown)}")
    for k, v in entry["baseline_phase_ms_rank0"].items():
        if v:
            last = v[-1]
            print(f"  {k} median ms per phase (last round): " + ", ".join(
                f"{p} {x:.1f}" for p, x in last.items()))  # fmt: skip
    for k, v in entry["dagtrain_last_step_ms_rank0"].items():
        if v and v[-1]:
            print(f"  {k} last step, ms per task (last round): " + ", ".join(
                f"{p} {x:.1f}" for p, x in v[-1].items()))  # fmt: skip


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
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of MODELS")
    ap.add_argument("--out", default=None, help=out_help("train_throughput"))
    args = ap.parse_args()
    args.out = str(results_path("train_throughput", args.out, args.quick))
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    steps = 8 if args.quick else args.steps
    repeats = 1 if args.quick else args.repeats
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(
        f"{NPROCS} ranks on {os.cpu_count()} CPUs, {steps} steps after {WARMUP} warm-up, "
        f"{repeats} round(s); samples/s of the median step"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: measure(n, MODELS[n], steps, repeats, f"{tmp}/{n}") for n in names}
    out = Path(args.out)
    doc = _merged(out, results, names)
    doc.update(
        {
            "date": time.strftime("%Y-%m-%d"),
            "ranks": NPROCS,
            "cpus": os.cpu_count(),
            "batch": BATCH,
            "steps": steps,
            "warmup": WARMUP,
            "repeats": repeats,
        }
    )
    doc["results"] = {**doc.get("results", {}), **results}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=1) + "\n")
    tmp_out.replace(out)
    print(f"\nwrote {args.out} ({time.perf_counter() - started:.0f} s)")


def _merged(out: Path, results: dict, names: list[str]) -> dict:
    """The document to write: a run of every model replaces the file; a run of some
    keeps the file's entries of the others (each marked with the run it came from) and
    says so in ``notes``."""
    if set(names) == set(MODELS) or not out.exists():
        return {}
    old = json.loads(out.read_text())
    kept = {k: v for k, v in old.get("results", {}).items() if k not in results}
    for v in kept.values():
        v.setdefault(
            "measured",
            {
                "date": old.get("date"),
                "steps": old.get("steps"),
                "warmup": old.get("warmup"),
                "repeats": old.get("repeats"),
            },
        )
        v.setdefault("batch", old.get("batch", BATCH))
    note = (
        f"{', '.join(results)} measured {time.strftime('%Y-%m-%d')} on their own and merged; "
        f"{', '.join(kept)} kept from an earlier run: each entry's 'measured' says when"
    )
    return {"notes": note, "results": kept} if kept else {}


if __name__ == "__main__":
    main()
