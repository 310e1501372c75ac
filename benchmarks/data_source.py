"""What reading a DAG author's Dataset costs against arrays in memory, in one run.

    .venv/bin/python benchmarks/data_source.py [--steps 60] [--rounds 3]

The same training run (digits, an MLP of 256x256, global batch 64, 2 torch ranks, one
intra-op thread each) on five sources of the same samples:

  arrays              data.source an .npz: a batch is an index into tensors in memory
  dataset             a map-style Dataset, ``dataset[i]`` per sample of the rank's share
  dataset, 2 workers  the same, read by 2 DataLoader worker processes per rank
  slow dataset        a Dataset that spends 0.5 ms per item (decoding, say), read in the rank
  slow dataset, 2 workers  the same, read ahead by 2 worker processes per rank

Each source goes the way a pipeline takes it: the data-prep stage (``prepare``: an
.npz's arrays split and written; a Dataset's items read once, checked, their indices
split) and then the training run on the prepared train and validation splits, as the
train stage's ranks get them. Timed for each: prep, the whole training run (ranks
started, data opened, model built, every step, the end), and its median step. The
parameters of the first three are checked to be the same bits (the sources hold the
same samples in the same order). Writes
benchmarks/results/data_source.json. This machine has 2 cores: worker processes
compete with the ranks for them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dagtrain.training import TrainConfig, run_training  # noqa: E402

SLOW_SECONDS = 0.0005


class Digits(torch.utils.data.Dataset):
    def __init__(self, seconds: float = 0.0) -> None:
        from sklearn.datasets import load_digits

        d = load_digits()
        self.x = d.data.astype(np.float32).reshape(-1, 1, 8, 8)
        self.y = d.target.astype(np.int64)
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if self.seconds:
            time.sleep(self.seconds)
        return torch.from_numpy(self.x[i]), int(self.y[i])


def digits() -> Digits:
    return Digits()


def slow_digits() -> Digits:
    return Digits(SLOW_SECONDS)


def systems(npz: Path) -> dict[str, tuple[str, int]]:
    """name -> (data.source, data.workers)"""
    return {
        "arrays": (str(npz), 0),
        "dataset": ("benchmarks.data_source:digits", 0),
        "dataset, 2 workers": ("benchmarks.data_source:digits", 2),
        "slow dataset": ("benchmarks.data_source:slow_digits", 0),
        "slow dataset, 2 workers": ("benchmarks.data_source:slow_digits", 2),
    }


def once(source: str, workers: int, steps: int, tmp: Path) -> dict:
    from dagtrain.config import load_config
    from dagtrain.phases.prep import data_file, prepare

    art = Path(tempfile.mkdtemp(dir=tmp))
    (art / "p.yaml").write_text(
        json.dumps(
            {
                "name": "bench",
                "artifacts": {"root": str(art)},
                "data": {"source": source, "workers": workers},
            }
        )
    )
    t0 = time.perf_counter()
    manifest = prepare(load_config(art / "p.yaml"))
    prep = time.perf_counter() - t0
    cfg = TrainConfig(
        backend="torch",
        data=data_file(manifest, "train"),
        eval_data=data_file(manifest, "val"),
        data_workers=workers,
        epochs=100,
        max_steps=steps,
        batch_size=64,
        model_args={"hidden": [256, 256]},
        intra_op_threads=1,
    )
    t0 = time.perf_counter()
    r = run_training(cfg, 2, on_line=lambda line: None, timeout=1800)
    wall = time.perf_counter() - t0
    step = statistics.median(r.step_seconds[5:] or r.step_seconds)
    return {"prep_s": prep, "wall_s": wall, "step_s": step, "params_sha256": r.params_sha256}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "data_source.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "digits.npz"
        d = Digits()
        np.savez(npz, x=d.x, y=d.y)
        runs: dict[str, list[dict]] = {name: [] for name in systems(npz)}
        for k in range(a.rounds):
            names = list(runs)
            for name in names[k % len(names) :] + names[: k % len(names)]:  # rotate
                runs[name].append(once(*systems(npz)[name], a.steps, Path(tmp)))
                print(f"round {k + 1} {name}: {runs[name][-1]['wall_s']:.1f} s", flush=True)
    same = {runs[n][0]["params_sha256"] for n in ("arrays", "dataset", "dataset, 2 workers")}
    base = statistics.median(r["step_s"] for r in runs["arrays"])
    base_wall = statistics.median(r["wall_s"] for r in runs["arrays"])
    rows = {}
    print(
        f"\n{'source':<25}{'prep s':>7}{'samples/s':>10}{'vs arrays':>10}"
        f"{'train s':>8}{'vs arrays':>10}"
    )
    for name, rs in runs.items():
        step = statistics.median(r["step_s"] for r in rs)
        wall = statistics.median(r["wall_s"] for r in rs)
        prep = statistics.median(r["prep_s"] for r in rs)
        rows[name] = {
            "prep_seconds": prep,
            "samples_per_second": 64 / step,
            "step_ratio_vs_arrays": base / step,
            "run_seconds": wall,
            "run_ratio_vs_arrays": base_wall / wall,
            "rounds": rs,
        }
        print(
            f"{name:<25}{prep:>7.1f}{64 / step:>10.0f}{base / step:>9.2f}x"
            f"{wall:>8.1f}{base_wall / wall:>9.2f}x"
        )
    print(f"\nsame parameters (arrays, dataset, dataset with workers): {len(same) == 1}")
    out = {
        "steps": a.steps,
        "rounds": a.rounds,
        "ranks": 2,
        "batch": 64,
        "slow_item_seconds": SLOW_SECONDS,
        "same_parameters": len(same) == 1,
        "systems": rows,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": __import__("os").cpu_count(),
        },
        "note": "ratios > 1: faster than arrays in memory; step: median step time after 5",
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
