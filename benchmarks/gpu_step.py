"""dagtrain's step against a plain PyTorch loop on one GPU, then ``dagtrain run`` on CUDA.

    .venv/bin/python benchmarks/gpu_step.py [--steps 200] [--rounds 5] [--batch 64]
        [--no-run] [--run-timeout 300] [--out benchmarks/results/gpu_step.json]

Needs a CUDA device: where torch sees none, it says so in one line and exits 2 before
any work (so it does where Airflow, which ``dagtrain run`` needs, is not installed,
unless ``--no-run``).

One process, one rank (backend ``local``), the models of train_throughput.py (the 21M
MLP, the residual CNN), digits, global batch ``--batch`` (train_throughput's by
default). Every system reads the same batches in the same order (the trainer's own
batch iterator: cut on the host, copied to the GPU inside the step), starts from the
same parameters (seed 0) and updates with the optimizer dagtrain's config makes:

  dagtrain     StepGraph with the default config (bucketed gradients, overlap where
               the model has more than one bucket and rank 0 measures it faster), the
               step as the trainer runs it (its prefetch task cuts the next batch)
  torch        a plain PyTorch loop: batch to the GPU, zero_grad, forward, loss,
               backward, optimizer step; it reads the loss and the count of correct
               predictions back every step, as dagtrain's step does (it returns them)
  torch-async  the same loop without those two reads: nothing in it waits for the GPU

Timed alike for every system: per round, ``--warmup`` steps, ``torch.cuda.synchronize()``,
``--steps`` steps, ``synchronize()``; samples/s = steps x batch / seconds. The systems
take turns within each round, in an order that rotates from round to round, so a slow
spell of the machine falls on all; the median round counts. The graph's build is not
timed (train_throughput.py times steps only); it is reported. The goal: dagtrain at
least 0.95x ``torch``. After the rounds every system has trained the same steps on the
same batches: the largest difference between dagtrain's parameters and each loop's is
reported, a check that they did the same work.

Then the GPU path end to end: ``dagtrain run`` on a copy of dags/digits_retraining.yaml
with ``--set distributed.device=cuda``, ``distributed.ranks=1`` and
``distributed.backend=torch`` (NCCL, a world of one) in a fresh ``--home``; its exit
status, wall seconds, the test accuracy of its evaluation, and the device, backend and
samples/s its training stage reports.

Writes benchmarks/results/gpu_step.json; exits 1 when the ``dagtrain run`` failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import BATCH, MODELS, WARMUP  # noqa: E402

DEFAULT_OUT = HERE / "results" / "gpu_step.json"
PIPELINE = ROOT / "dags" / "digits_retraining.yaml"
GOAL = 0.95  # dagtrain's samples/s over the plain loop's (the "torch" system)
REFUSAL = (
    "gpu_step.py: no CUDA device found (torch.cuda.is_available() is False); it measures "
    "dagtrain's training step against a plain PyTorch loop on a GPU (the 21M MLP and the "
    "residual CNN, one rank) and a `dagtrain run` of the digits pipeline with "
    "distributed.device cuda: run it on a machine with a CUDA GPU"
)
# after the timeout, how long `dagtrain run` may take to stop its run on SIGINT (its
# Ctrl-C: the tasks and their ranks end) before it is killed
STOP_GRACE = 30.0


@dataclass
class System:
    """One way of training: ``step()`` runs one step, ``model`` is what it trains."""

    name: str
    step: Callable[[], None]
    model: Any
    build_seconds: float
    close: Callable[[], None] = lambda: None
    info: Callable[[], dict[str, Any]] = dict


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _config(model: dict, batch: int, device: str):
    from dagtrain.config import TrainConfig

    return TrainConfig(
        backend="local", device=device, epochs=1_000_000, batch_size=batch, lr=0.01, **model
    )


def _model(cfg, ds, device):
    import torch

    from dagtrain.training.rank.models import build_model

    torch.manual_seed(0)
    return build_model(cfg.model.name, ds.in_shape, ds.classes, **cfg.model.args).to(device)


def dagtrain_system(cfg, ds, device) -> System:
    """dagtrain's step as the trainer drives it, on the backend of a one-process run."""
    from dagtrain.sync import get_backend
    from dagtrain.training.rank.step import StepGraph
    from dagtrain.training.rank.trainer import _batches

    model = _model(cfg, ds, device)  # on the GPU before the buckets take its parameters
    backend = get_backend("local", cfg.distributed.collective_timeout, device=str(device))
    t0 = time.perf_counter()
    sg = StepGraph(cfg, model, backend)
    build = time.perf_counter() - t0
    batches = _batches(ds, cfg, 0, 1, 0)
    sg.fetch = lambda: next(batches, None)
    sg.prefetched = next(batches)

    def step() -> None:
        sg.run(sg.prefetched[2])

    def info() -> dict[str, Any]:
        # with one bucket, or overlap off, the step is always the plain one
        return {"buckets": len(sg.buckets), "overlap": sg.overlap, "last": sg.overlapping}

    return System("dagtrain", step, model, build, sg.close, info)


def torch_system(cfg, ds, device, readback: bool) -> System:
    """The plain loop, on the same batches, with the optimizer dagtrain's config makes."""
    from torch import nn

    from dagtrain.training.rank.optimizers import make_optimizer
    from dagtrain.training.rank.trainer import _batches

    model = _model(cfg, ds, device)
    t0 = time.perf_counter()
    opt = make_optimizer(cfg, list(model.parameters()))
    build = time.perf_counter() - t0
    loss_fn = nn.CrossEntropyLoss()
    batches = _batches(ds, cfg, 0, 1, 0)
    seen: list[tuple[float, int]] = []

    def step() -> None:
        _, _, (x, y, _) = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        if readback:  # what dagtrain's step returns: the loss and the correct count
            seen[:] = [(loss.item(), int((out.argmax(dim=1) == y).sum()))]

    return System("torch" if readback else "torch-async", step, model, build)


def _max_difference(a, b) -> float:
    """The largest absolute difference between two models' parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    return max(
        (float((sa[k].double() - sb[k].double()).abs().max()) for k in sa if sa[k].numel()),
        default=0.0,
    )


def measure(model: dict, args, ds, device) -> dict[str, Any]:
    """Every system's rounds on one model; samples/s, ratios, the parameter check."""
    import torch

    cfg = _config(model, args.batch, device.type)
    torch.set_num_threads(cfg.executor.intra_op_threads)  # as the trainer does
    systems = [
        dagtrain_system(cfg, ds, device),
        torch_system(cfg, ds, device, readback=True),
        torch_system(cfg, ds, device, readback=False),
    ]
    rounds: dict[str, list[float]] = {s.name: [] for s in systems}
    try:
        for r in range(args.rounds):
            k = r % len(systems)
            for s in systems[k:] + systems[:k]:
                for _ in range(args.warmup):
                    s.step()
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    s.step()
                _sync(device)
                rounds[s.name].append(args.steps * args.batch / (time.perf_counter() - t0))
        graph = systems[0].info()
    finally:
        for s in systems:
            s.close()
    sps = {k: statistics.median(v) for k, v in rounds.items()}
    ratios = {
        "dagtrain_vs_torch": sps["dagtrain"] / sps["torch"],
        "dagtrain_vs_torch_async": sps["dagtrain"] / sps["torch-async"],
    }
    ours = systems[0]
    return {
        "samples_per_s": sps,
        "rounds_samples_per_s": rounds,
        "ratios": ratios,
        "goal_met": ratios["dagtrain_vs_torch"] >= GOAL,
        "build_seconds": {s.name: s.build_seconds for s in systems},
        "parameters": sum(p.numel() for p in ours.model.parameters()),
        "buckets": graph["buckets"],
        "overlap_possible": graph["overlap"],
        "last_step_overlapped": graph["last"],
        "max_parameter_difference": {
            s.name: _max_difference(ours.model, s.model) for s in systems[1:]
        },
    }


def run_pipeline(device: str, backend: str, timeout: float, env: dict[str, str]) -> dict:
    """``dagtrain run`` on a copy of the digits pipeline, one rank on ``device``."""
    from dagtrain.config import load_config
    from dagtrain.records.layout import ArtifactLayout, RunLayout
    from dagtrain.records.registry import read_evaluation
    from dagtrain.records.result import read_summary

    sets = {"distributed.device": device, "distributed.ranks": 1, "distributed.backend": backend}
    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        cfg_path = Path(tmp) / PIPELINE.name
        shutil.copy(PIPELINE, cfg_path)
        home = Path(tmp) / "home"
        argv = [sys.executable, "-m", "dagtrain", "run", str(cfg_path), "--home", str(home)]
        for k, v in sets.items():
            argv += ["--set", f"{k}={v}"]
        log = Path(tmp) / "run.out"
        t0 = time.monotonic()
        timed_out = False
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                p.send_signal(signal.SIGINT)  # its Ctrl-C: the run, its tasks, ranks end
                try:
                    p.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=STOP_GRACE)
                rc = p.returncode
        wall = time.monotonic() - t0
        out: dict[str, Any] = {
            "config": str(PIPELINE.relative_to(ROOT)),
            "sets": sets,
            "exit_status": rc,
            "timed_out": timed_out,
            "wall_seconds": wall,
            "test_accuracy": None,
            "train": None,
        }
        layout = ArtifactLayout(load_config(cfg_path).artifact_root(home))
        if ran := sorted(layout.runs.glob("*/*")):  # runs/<dag>/<run>: this home's one
            run = RunLayout(ran[-1])
            if (ev := read_evaluation(run.evaluation)) is not None:
                out["test_accuracy"] = ev.metrics["test_accuracy"]
            if (res := read_summary(run.train.result)) is not None:
                out["train"] = {
                    "device": res.config["distributed"]["device"],
                    "backend": res.backend,
                    "world": res.world,
                    "samples_per_second": res.samples_per_second,
                    "median_step_seconds": res.median_step_seconds,
                    "steps": res.steps,
                }
        # what a failed run said: its error, the ranks' tracebacks (its home is removed)
        text = log.read_text(errors="replace").splitlines()
        out["output_tail"] = text[-60:] if rc != 0 else None
    return out


def environment(device) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "device": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    env["commit"] = commit or None
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="timed steps per round and system")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over all systems")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before each")
    ap.add_argument("--batch", type=int, default=BATCH, help="the batch of every system")
    ap.add_argument("--no-run", action="store_true", help="skip the `dagtrain run` part")
    ap.add_argument("--run-backend", default="torch", help="distributed.backend of the run")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds for the run")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    # the tests' smoke mode: the same code on the CPU, never into results/
    ap.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    env = dict(os.environ)  # the run's: before choose_device narrows CUDA_VISIBLE_DEVICES

    import torch

    if not torch.cuda.is_available():
        if not args.allow_cpu:
            print(REFUSAL, file=sys.stderr)
            return 2
        if Path(args.out).resolve() == DEFAULT_OUT:
            print("gpu_step.py: --allow-cpu writes CPU figures: give --out", file=sys.stderr)
            return 2
    if not args.no_run and importlib.util.find_spec("airflow") is None:
        # found now, not after the minutes of measuring: `dagtrain run` is Airflow's
        print(
            "gpu_step.py: `dagtrain run` needs Airflow, which this Python lacks: install "
            "dagtrain's dependencies, or give --no-run",
            file=sys.stderr,
        )
        return 2
    from dagtrain.training.rank.data import load_dataset
    from dagtrain.training.rank.device import choose_device

    device = choose_device("cuda" if torch.cuda.is_available() else "cpu")
    info = environment(device)
    print(
        f"one rank on {info.get('gpu', 'the CPU')}, batch {args.batch}, {args.steps} steps "
        f"after {args.warmup} warm-up, {args.rounds} rounds; samples/s of the median round"
    )
    ds = load_dataset("digits", 0.2, 0)
    results = {}
    for name, model in MODELS.items():
        if "data" in model:  # a model of its own data (the causal LM): not of digits
            continue
        res = results[name] = measure(model, args, ds, device)
        print(
            f"\n{name} ({res['parameters']:,} parameters, {res['buckets']} bucket(s); "
            f"dagtrain's last step {'overlapped' if res['last_step_overlapped'] else 'plain'})"
        )
        for k, v in res["samples_per_s"].items():
            print(f"  {k:<12}{v:11.1f} samples/s")
        ratio = res["ratios"]["dagtrain_vs_torch"]
        print(
            f"  dagtrain / torch {ratio:.3f}x (goal {GOAL}x: "
            f"{'met' if res['goal_met'] else 'not met'}), dagtrain / torch-async "
            f"{res['ratios']['dagtrain_vs_torch_async']:.3f}x; largest parameter "
            f"difference to torch {res['max_parameter_difference']['torch']:.2e}"
        )
    run = None
    if not args.no_run:
        print(f"\ndagtrain run {PIPELINE.name}: distributed.device {device.type}, one rank")
        run = run_pipeline(device.type, args.run_backend, args.run_timeout, env)
        acc = run["test_accuracy"]
        print(
            f"  exit status {run['exit_status']}{' (timed out)' if run['timed_out'] else ''}, "
            f"{run['wall_seconds']:.1f} s, test accuracy "
            f"{'-' if acc is None else f'{acc:.4f}'}, trained on "
            f"{(run['train'] or {}).get('device', '-')}"
        )
        if run["exit_status"] != 0:
            print("\n".join("  | " + line for line in run["output_tail"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "smoke": device.type != "cuda",
                "environment": info,
                "ranks": 1,
                "batch": args.batch,
                "steps": args.steps,
                "warmup": args.warmup,
                "rounds": args.rounds,
                "goal": GOAL,
                "results": results,
                "dagtrain_run": run,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\nwrote {out}")
    return 1 if run is not None and run["exit_status"] != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
