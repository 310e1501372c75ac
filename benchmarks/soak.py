"""A soak of elastic training: many short runs, each with one random fault at a random
moment, counting how each ended. Not part of the test run.

Each run is an elastic training run (3 ranks, ``min_ranks: 2``, the 2x128 MLP on
digits, 40 epochs (1920 steps, ~5 s on 3 ranks), a checkpoint every 25 steps,
``collective_timeout: 5``), started by a launching process of its own (``python
benchmarks/soak.py --try CONFIG RESULT``) that calls ``run_training``, as a training
task does. One fault, at a random moment (0.2 to 4 s)
after the ranks start training:

- ``sigkill_rank``, ``sigstop_rank``: a random rank (rank 0 included);
- ``kill_host``: every process of one "host" (the host list is ``localhost:2,
  127.0.0.1:1``, two names of this machine: either both ranks of the first, the
  rank 0 among them, or the one rank of the second: this machine answers, so the
  next world starts on its slots again);
- ``sigkill_launcher``: the launching process itself (as the OOM killer or Airflow's
  supervisor would);
- ``kill_airflow_task``: a run through Airflow (``dagtrain run`` of a copy of the
  digits pipeline, embedded SQLite, ``retries: 1``) whose training task's process is
  SIGKILLed.

A try that fails is tried once more (Airflow's retry; for the Airflow runs, Airflow's
own). Each run counts as ``completed`` (a try trained to the end), ``failed_named``
(the last try failed with an error naming the rank or host), ``failed_unnamed``,
or ``hung`` (a try past its deadline, 240 s: then killed). After each run:
``orphans``, the processes left that carry the run's marker in their environment;
``corrupt_checkpoints``, checkpoints (and rescues) whose sidecar is there but whose
bytes do not load. Steps lost per recovery in the same try come from the result's
world changes. Writes benchmarks/results/soak.json.

    .venv/bin/python benchmarks/soak.py [--runs 30] [--airflow-runs 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARK = "DAGTRAIN_SOAK"
DEADLINE = 240.0
FAULTS = ("sigkill_rank", "sigstop_rank", "kill_host", "sigkill_launcher")


def train_config(tmp: Path, backend: str) -> dict:
    return {
        "model": {"name": "mlp", "args": {"hidden": [128, 128]}},
        "training": {"epochs": 40, "batch_size": 30, "checkpoint_every": 25},
        "distributed": {
            "backend": backend,
            "ranks": 3,
            "min_ranks": 2,
            "collective_timeout": 5,
            "hosts": ["localhost:2", "127.0.0.1:1"] if backend == "torch" else [],
        },
        "checkpoint_dir": str(tmp / "ckpt"),
        "status_dir": str(tmp / "ranks"),
        "metrics_file": str(tmp / "metrics.jsonl"),
    }


def one_try(config: str, result: str) -> int:
    """The launching process of one try: run_training, then its result or its error."""
    from dagtrain.launch import RankFailure
    from dagtrain.training import TrainConfig, run_training

    cfg = TrainConfig.model_validate_json(Path(config).read_text())
    try:
        res = run_training(cfg, on_line=lambda line: None)
    except RankFailure as e:
        Path(result).write_text(json.dumps({"failed": str(e).splitlines()[0], "rank": e.rank}))
        return 1
    Path(result).write_text(
        json.dumps({"steps": res.steps, "world": res.world, "world_changes": res.world_changes})
    )
    return 0


def _records(folder: Path) -> dict:
    from dagtrain.records.status import read_records

    return read_records(folder)


def _marked(tag: str) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _sweep(tag: str) -> None:
    for pid in _marked(tag):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _corrupt(ckpt: Path) -> int:
    """Checkpoints and rescues whose sidecar is there but whose bytes do not load."""
    from dagtrain.training.rank import checkpoint

    bad = 0
    for side in ckpt.rglob("ckpt-*.pt.json"):
        try:
            checkpoint.load(side.with_suffix(""))
        except Exception:  # counted
            bad += 1
    return bad


def _fault_later(fault: str, status: Path, proc: subprocess.Popen, rng: random.Random, box: dict):
    """Wait for the ranks of the first world to train, then a random moment, then do
    ``fault``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        recs = _records(status)
        if len(recs) == 3 and all(r.status == "running" for r in recs.values()):
            break
        time.sleep(0.05)
    else:
        return
    time.sleep(rng.uniform(0.2, 4.0))
    recs = _records(status)
    box["time"] = time.time()
    box["during"] = proc.poll() is None and all(r.status == "running" for r in recs.values())
    if fault == "sigkill_launcher":
        os.kill(proc.pid, signal.SIGKILL)
        box["what"] = "the launching process"
        return
    if fault == "kill_host":
        ranks = [0, 1] if rng.random() < 0.5 else [2]
        box["what"] = f"host {'localhost' if ranks == [0, 1] else '127.0.0.1'} (ranks {ranks})"
        sig = signal.SIGKILL
    else:
        ranks = [rng.randrange(3)]
        sig = signal.SIGKILL if fault == "sigkill_rank" else signal.SIGSTOP
        box["what"] = f"rank {ranks[0]}"
    for r in ranks:
        pid = recs[r].pid if r in recs else None
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def training_run(i: int, backend: str, fault: str, rng: random.Random) -> dict:
    tag = f"soak{os.getpid()}-{i}"
    tmp = Path(tempfile.mkdtemp(prefix=f"soak-{i}-"))
    cfg = tmp / "config.json"
    cfg.write_text(json.dumps(train_config(tmp, backend)))
    env = {**os.environ, MARK: tag, "PYTHONPATH": str(ROOT)}
    tries, outcome, box = [], None, {}
    for n in (1, 2):
        out = tmp / f"result{n}.json"
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--try", str(cfg), str(out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"try{n}.log", "w"),  # noqa: SIM115 (the child's)
            start_new_session=True,
        )
        if n == 1:
            threading.Thread(
                target=_fault_later,
                args=(fault, Path(train_config(tmp, backend)["status_dir"]), proc, rng, box),
                daemon=True,
            ).start()
        try:
            proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            outcome = "hung"
            break
        got = json.loads(out.read_text()) if out.exists() else None
        tries.append({"exit": proc.returncode, **(got or {})})
        if proc.returncode == 0:
            outcome = "completed"
            break
        time.sleep(0.5)
    if outcome is None:
        last = tries[-1] if tries else {}
        named = "rank" in str(last.get("failed", "")) or "host" in str(last.get("failed", ""))
        outcome = "failed_named" if named else "failed_unnamed"
    time.sleep(1.0)  # what the kernel kills on a parent's death takes a moment
    orphans = _marked(tag)
    _sweep(tag)
    changes = [c for t in tries for c in t.get("world_changes", [])]
    return {
        "run": i,
        "backend": backend,
        "fault": fault,
        "hit": box.get("what"),
        "while_training": box.get("during"),
        "outcome": outcome,
        "tries": len(tries) + (outcome == "hung"),
        "try_exits": [t["exit"] for t in tries],
        "failure": next((t["failed"] for t in tries if "failed" in t), None),
        "world_changes": len(changes),
        "steps_lost": [c["steps_lost"] for c in changes if c.get("steps_lost") is not None],
        "orphans": len(orphans),
        "corrupt_checkpoints": _corrupt(tmp / "ckpt"),
    }


def airflow_run(i: int, rng: random.Random) -> dict:
    import psutil
    import yaml

    tag = f"soak{os.getpid()}-{i}"
    tmp = Path(tempfile.mkdtemp(prefix=f"soak-af-{i}-"))
    cfg = yaml.safe_load((ROOT / "dags/digits_retraining.yaml").read_text())
    cfg["name"] = f"soak_{i}"
    cfg["schedule"] = {"cron": None}
    cfg["training"].update({"epochs": 8, "batch_size": 30, "retries": 1, "retry_delay_seconds": 1})
    cfg["distributed"] = {"backend": "torch", "ranks": 3, "min_ranks": 2, "collective_timeout": 5}
    path = tmp / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, MARK: tag}
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/dagtrain"), "run", str(path), "--home", str(tmp / "home")],
        env=env,
        stdout=open(tmp / "run.log", "w"),  # noqa: SIM115 (the child's)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    box: dict = {}

    def fault() -> None:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = [
                p
                for p in psutil.process_iter(["pid", "cmdline"])
                if "dagtrain.training.rank" in " ".join(p.info["cmdline"] or [])
                and p.environ().get(MARK) == tag
            ]
            if len(ranks) == 3:
                time.sleep(rng.uniform(0.2, 3.0))
                try:
                    task = psutil.Process(ranks[0].pid).parent()  # the task's process
                    box["what"] = f"the Airflow task process (pid {task.pid})"
                    task.kill()
                except psutil.Error:
                    pass
                return
            time.sleep(0.1)

    threading.Thread(target=fault, daemon=True).start()
    try:
        proc.wait(timeout=DEADLINE * 2)
        outcome = "completed" if proc.returncode == 0 else "failed_named"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        outcome = "hung"
    time.sleep(1.0)
    orphans = _marked(tag)
    _sweep(tag)
    ckpts = list((tmp / "home").rglob("checkpoints"))
    return {
        "run": i,
        "backend": "torch",
        "fault": "kill_airflow_task",
        "hit": box.get("what"),
        "outcome": outcome,
        "exit": proc.returncode,
        "orphans": len(orphans),
        "corrupt_checkpoints": sum(_corrupt(c) for c in ckpts),
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--try":
        sys.exit(one_try(sys.argv[2], sys.argv[3]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30, help="training runs (not Airflow's)")
    ap.add_argument("--airflow-runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/soak.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    runs = []
    plan = [("train", FAULTS[k % len(FAULTS)]) for k in range(args.runs)]
    plan += [("airflow", "kill_airflow_task")] * args.airflow_runs
    rng.shuffle(plan)
    t0 = time.monotonic()
    for i, (kind, fault) in enumerate(plan):
        if kind == "airflow":
            r = airflow_run(i, rng)
        else:
            r = training_run(
                i, rng.choice(("torch", "mpi")) if fault != "kill_host" else "torch", fault, rng
            )
        runs.append(r)
        print(
            f"{i:3d} {r['backend']:6s} {r['fault']:18s} {r['hit']!s:40s} -> "
            f"{r['outcome']}, orphans {r['orphans']}, corrupt {r['corrupt_checkpoints']}",
            flush=True,
        )
    lost = [s for r in runs for s in r.get("steps_lost", [])]
    count = {
        k: sum(r["outcome"] == k for r in runs)
        for k in ("completed", "failed_named", "failed_unnamed", "hung")
    }
    out = {
        "runs": len(runs),
        **count,
        "orphans": sum(r["orphans"] for r in runs),
        "corrupt_checkpoints": sum(r["corrupt_checkpoints"] for r in runs),
        "recovered_in_try": sum(1 for r in runs if r.get("world_changes")),
        "faults_while_training": sum(1 for r in runs if r.get("while_training")),
        "steps_lost_per_recovery": {
            "median": statistics.median(lost) if lost else None,
            "max": max(lost) if lost else None,
            "all": lost,
        },
        "by_fault": {
            f: {k: sum(r["outcome"] == k for r in runs if r["fault"] == f) for k in count}
            for f in (*FAULTS, "kill_airflow_task")
        },
        "seconds": round(time.monotonic() - t0),
        "detail": runs,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "detail"}, indent=1))


if __name__ == "__main__":
    main()
