"""Train on several ranks from the command line: ``python -m dagtrain.training``.

    python -m dagtrain.training --ranks 2 --backend mpi --epochs 3
    python -m dagtrain.training --config run.json          (a TrainConfig as JSON)

Prints each epoch's metrics and rank 0's test accuracy; exits non-zero if a rank fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dagtrain.training", description=__doc__)
    ap.add_argument("--config", help="a TrainConfig as a JSON file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", choices=["local", "torch", "mpi", "horovod"])
    ap.add_argument("--launcher", choices=["mpirun", "horovodrun", "torchrun", "direct"])
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--quiet", action="store_true", help="do not echo the ranks' logs")
    args = ap.parse_args(argv)

    from dagtrain.launch import RankFailure, run_training
    from dagtrain.training.config import TrainConfig

    fields = json.loads(Path(args.config).read_text()) if args.config else {"backend": "mpi"}
    for key in ("backend", "epochs", "model", "data", "checkpoint_dir"):
        value = getattr(args, key)
        if value is not None:
            fields[key] = value
    try:
        cfg = TrainConfig(**fields)
    except ValidationError as e:
        print(f"invalid training config:\n{e}", file=sys.stderr)
        return 2
    ranks = 1 if cfg.backend == "local" else args.ranks
    print(
        f"training {cfg.model} on {cfg.data}: {ranks} ranks, backend {cfg.backend}, "
        f"{cfg.epochs} epochs",
        flush=True,
    )
    try:
        result = run_training(
            cfg, ranks, launcher=args.launcher, on_line=(lambda line: None) if args.quiet else None
        )
    except RankFailure as e:
        print(f"training failed: {e}", file=sys.stderr)
        return 1
    for row in result.epochs:
        print(
            "  "
            + ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
    print(
        f"test accuracy {result.test_accuracy:.4f}; {result.samples_per_second:.0f} "
        f"samples/s (median step); {result.steps} steps"
        + (f"; checkpoint {result.checkpoint}" if result.checkpoint else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
