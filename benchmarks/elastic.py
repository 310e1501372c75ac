"""What a lost rank costs: an elastic run against a restart from the newest periodic
checkpoint (what torchrun's ``--max-restarts``, Ray Train's ``max_failures`` and
Airflow's own retry do), on each backend.

For each backend (torch, mpi, horovod) and each round, two runs of the same work:
3 ranks, the 2x256 MLP on digits, global batch 30, 6 epochs (288 steps), a
checkpoint every 50 steps. In each, rank 1 is SIGKILLed as it starts a random step
(the same step for both systems in a round, between 60 and 230):

- **elastic**: ``distributed.min_ranks: 2``: the survivors save their last completed
  step and the run goes on in the same call, rank 1's slot used again by a new
  process (this host answers: 3 ranks again);
- **restart**: no ``min_ranks``: the job fails, and is started again at once on 3
  ranks (as a restart policy does), resuming from the newest periodic checkpoint.

Figures, measured the same way for both (benchmarks/elastic_model.py, the model's
own hooks): ``steps_lost``, the steps trained twice (the step in flight when the rank
died, and those completed since the state resumed from: ``step at the kill -
step resumed from``); ``recovery_seconds``, from the kill to the end of the first
backward of the world that goes on (detection, the survivors' save, the relaunch,
the resume). Writes benchmarks/results/elastic.json.

    .venv/bin/python benchmarks/elastic.py [--rounds 3] [--backends torch,mpi,horovod]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.elastic_model import read  # noqa: E402
from dagtrain.launch import RankFailure  # noqa: E402
from dagtrain.training import TrainConfig, run_training  # noqa: E402

STEPS = 288  # 6 epochs of 48 steps
EVERY = 50


def config(tmp: Path, backend: str, elastic: bool) -> TrainConfig:
    return TrainConfig(
        model="benchmarks.elastic_model:mlp",
        model_args={"hidden": [256, 256]},
        backend=backend,
        ranks=3,
        min_ranks=2 if elastic else None,
        regrow=False,
        epochs=6,
        batch_size=30,
        bucket_mb=0.5,
        checkpoint_every=EVERY,
        collective_timeout=30,
        checkpoint_dir=str(tmp / "ckpt"),
        status_dir=str(tmp / "ranks"),
        metrics_file=str(tmp / "metrics.jsonl"),
    )


def one(backend: str, elastic: bool, target: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"elastic-{backend}-"))
    steps = tmp / "steps"
    steps.mkdir()
    os.environ["DAGTRAIN_BENCH_STEPS"] = str(steps)
    cfg = config(tmp, backend, elastic)
    kill: dict = {}

    def on_start(job) -> None:
        if kill:
            return

        def go() -> None:
            kill["armed"] = True
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                count, _, _ = read(str(steps / "rank1.steps"))
                pid = (job.records.get(1) or {}).get("pid")
                if count >= target and pid:
                    os.kill(pid, signal.SIGKILL)
                    kill.update(time=time.time(), step=count)
                    return
                time.sleep(0.002)

        threading.Thread(target=go, daemon=True).start()

    quiet = {"on_line": lambda line: None}
    t0 = time.monotonic()
    if elastic:
        res = run_training(cfg, on_start=on_start, **quiet)
        resumed = res.world_changes[0]["step"]
    else:
        try:
            run_training(cfg, on_start=on_start, **quiet)
            raise RuntimeError("the killed run succeeded")
        except RankFailure:
            res = run_training(cfg, **quiet)  # the restart: every rank, from the checkpoint
        resumed = res.resumed_from_step or 0
    wall = time.monotonic() - t0
    _, _, first = read(str(steps / "rank0.steps"))  # the world that went on: its first
    assert res.steps == STEPS, res.steps
    return {
        "killed_at_step": kill["step"],
        "resumed_from_step": resumed,
        "steps_lost": kill["step"] - resumed,
        "recovery_seconds": round(first - kill["time"], 3),
        "wall_seconds": round(wall, 2),
        "final_world": res.world,
    }


def summary(runs: list[dict]) -> dict:
    lost = [r["steps_lost"] for r in runs]
    rec = [r["recovery_seconds"] for r in runs]
    return {
        "runs": runs,
        "steps_lost_median": statistics.median(lost),
        "steps_lost_max": max(lost),
        "recovery_seconds_median": round(statistics.median(rec), 3),
        "recovery_seconds_max": round(max(rec), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="torch,mpi,horovod")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/elastic.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "work": f"3 ranks, mlp 2x256 on digits, batch 30, {STEPS} steps, checkpoint every "
        f"{EVERY}; rank 1 SIGKILLed as it starts a random step in 60..230",
        "backends": {},
    }
    for backend in args.backends.split(","):
        runs: dict[str, list[dict]] = {"elastic": [], "restart": []}
        for k in range(args.rounds):
            target = rng.randint(60, 230)
            # alternate which system goes first: the machine's load falls on both alike
            order = ("elastic", "restart") if k % 2 == 0 else ("restart", "elastic")
            for system in order:
                r = one(backend, system == "elastic", target)
                runs[system].append(r)
                print(
                    f"{backend:8s} {system:8s} kill at {r['killed_at_step']:3d}: resumed "
                    f"{r['resumed_from_step']:3d}, {r['steps_lost']:2d} step(s) lost, "
                    f"recovered in {r['recovery_seconds']:.2f} s",
                    flush=True,
                )
        e, r = summary(runs["elastic"]), summary(runs["restart"])
        e["recovery_vs_restart"] = round(
            e["recovery_seconds_median"] / r["recovery_seconds_median"], 3
        )
        out["backends"][backend] = {"elastic": e, "restart": r}
        print(
            f"{backend}: elastic {e['steps_lost_median']} step(s) lost (max "
            f"{e['steps_lost_max']}), {e['recovery_seconds_median']:.2f} s; restart "
            f"{r['steps_lost_median']} step(s) lost, {r['recovery_seconds_median']:.2f} s",
            flush=True,
        )
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
