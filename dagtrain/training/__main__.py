"""Train on several ranks from the command line, without Airflow.

    python -m dagtrain.training --ranks 2 --backend mpi --epochs 3
    python -m dagtrain.training --config run.json    # a TrainConfig as JSON

Flags override the file's values. Prints each epoch's metrics and rank 0's test
accuracy; exits non-zero if a rank fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from dagtrain.config import BackendName, Launcher, explain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dagtrain.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the examples' lines
    )
    ap.add_argument("--config", help="a TrainConfig as a JSON file")
    ap.add_argument("--ranks", type=int, help="distributed.ranks (default 2; local: 1)")
    ap.add_argument(
        "--backend",
        choices=get_args(BackendName),
        metavar="BACKEND",
        help="distributed.backend: " + ", ".join(get_args(BackendName)),
    )
    ap.add_argument(
        "--launcher",
        choices=get_args(Launcher),
        metavar="LAUNCHER",
        help="distributed.launcher: " + ", ".join(get_args(Launcher)),
    )
    ap.add_argument("--epochs", type=int, help="training.epochs")
    ap.add_argument("--model", help="model.name")
    ap.add_argument(
        "--objective", help="objective.name: classification, regression, language_model"
    )
    ap.add_argument(
        "--data",
        help="'digits', 'diabetes', a .npz/.npy/.csv/.parquet file, or a text (.txt) or "
        "token ids (.bin, .npy) with --sequence-length",
    )
    ap.add_argument("--sequence-length", type=int, help="a text's or token file's window")
    ap.add_argument("--checkpoint-dir", help="checkpoints go here; a run resumes from them")
    ap.add_argument("--quiet", action="store_true", help="do not echo the ranks' logs")
    args = ap.parse_args(argv)

    from dagtrain.launch import RankFailure
    from dagtrain.training import TrainConfig, run_training

    fields = json.loads(Path(args.config).read_text()) if args.config else {"backend": "mpi"}
    flags = {
        "ranks": args.ranks,
        "backend": args.backend,
        "launcher": args.launcher,
        "epochs": args.epochs,
        "data": args.data,
        "objective": args.objective,
        "sequence_length": args.sequence_length,
        "checkpoint_dir": args.checkpoint_dir,
    }
    fields.update({k: v for k, v in flags.items() if v is not None})
    if args.model is not None:
        fields.setdefault("model", {})
        if isinstance(fields["model"], str):
            fields["model"] = {"name": fields["model"]}
        fields["model"]["name"] = args.model
    try:
        cfg = TrainConfig(**fields)
    except ValidationError as e:
        print(f"error: {explain(e, args.config or 'the flags')}", file=sys.stderr)
        return 2
    d = cfg.distributed
    print(
        f"training {cfg.model.name} on {cfg.data}: {d.ranks} ranks, backend {d.backend}, "
        f"{cfg.training.epochs} epochs",
        flush=True,
    )
    try:
        result = run_training(cfg, on_line=(lambda line: None) if args.quiet else None)
    except (RankFailure, TimeoutError) as e:
        print(f"training failed: {e}", file=sys.stderr)
        return 1
    for row in result.epochs:
        print(
            "  "
            + ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
    last = result.epochs[-1] if result.epochs else {}
    # the objective's first metric (what promotion would use), on the held-out split
    trained = (k.removeprefix("train_") for k in last if k.startswith("train_"))
    first = next(iter(cfg.objective.metrics() or {}), None) or next(trained, "loss")
    if f"test_{first}" in last:
        metric = f"test {first} {last[f'test_{first}']:.4f}"
    elif f"val_{first}" in last:
        metric = f"validation {first} {last[f'val_{first}']:.4f} (eval_data)"
    else:
        metric = f"no {first} yet (no epoch completed)"
    print(
        metric
        + f"; {result.samples_per_second:.0f} samples/s (median step); {result.steps} steps"
        + (f"; checkpoint {result.checkpoint}" if result.checkpoint else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
