"""The picture of an interleaved pipeline step in docs/parallelism.md, from a real run.

    .venv/bin/python tools/pipeline_picture.py [--out docs/images/pipeline-interleaved.png]
    .venv/bin/python tools/pipeline_picture.py --placement v --order zero-bubble \
        --out docs/images/pipeline-v.png

Trains a 2-stage MLP (eight hidden layers of 1024, 18 blocks in 4 parts:
``parallel: {stages: 2, chunks: 2, microbatches: 4, order: 1f1b}``, or the given order
and placement) for a few steps
with traces on, then draws its last step's trace: a lane per rank, each F/B op as a
bar labelled ``m.j`` where it is wide enough (microbatch m through the rank's chunk j),
coloured by chunk; and prints each rank's compute ops in the order they ran (the text
the docs show under the picture). It measures nothing reported anywhere else;
matplotlib comes with the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import get_args

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    from dagtrain.config.schema import Order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        default=str(HERE.parent / "docs" / "images" / "pipeline-interleaved.png"),
        help="the PNG to write (default: the doc's interleaved picture)",
    )
    ap.add_argument(
        "--order",
        default="1f1b",
        choices=[o for o in get_args(Order) if o != "auto"],
        help="parallel.order of the 2-chunk run (default: 1f1b)",
    )
    ap.add_argument(
        "--placement",
        default="looped",
        choices=["looped", "v"],
        help="parallel.placement of the two chunks (default: looped)",
    )
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dagtrain.records.trace import chunk_of, parse_op
    from dagtrain.training import TrainConfig, run_training

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            model={"name": "mlp", "args": {"hidden": [1024] * 8}},
            training={"epochs": 1, "max_steps": 6, "batch_size": 64},
            distributed={"backend": "torch", "ranks": 2},
            parallel={
                "stages": 2,
                "chunks": 2,
                "microbatches": 4,
                "order": args.order,
                "placement": args.placement,
            },
            checkpoint_dir=str(Path(tmp) / "ckpt"),
            trace_dir=str(Path(tmp) / "trace"),
        )
        r = run_training(cfg, on_line=lambda line: None)
        lanes = []
        for rank in range(2):
            doc = json.loads((Path(tmp) / "trace" / f"step-rank{rank}.json").read_text())
            ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
            ops = []
            for e in ev:
                got = parse_op(e["name"])
                if got is not None and got[0].value in ("F", "B", "W"):
                    ops.append((e["ts"], e["dur"], got[0].value, got[1], chunk_of(e["name"])))
            lanes.append(sorted(ops))
    t0 = min(op[0] for lane in lanes for op in lane)
    colours = {("F", 0): "#9ecae1", ("F", 1): "#3182bd", ("B", 0): "#fdae6b", ("B", 1): "#e6550d"}
    colours |= {("W", 0): "#a1d99b", ("W", 1): "#31a354"}
    span = max(ts + dur for lane in lanes for ts, dur, *_ in lane) - t0
    fig, ax = plt.subplots(figsize=(11, 2.4))
    for rank, lane in enumerate(lanes):
        y = 1 - rank
        for ts, dur, kind, m, j in lane:
            x = (ts - t0) / 1e3
            ax.barh(y, dur / 1e3, left=x, height=0.6, color=colours[kind, j or 0],
                    edgecolor="white")  # fmt: skip
            if dur >= span / 40:  # (a label wider than its bar would cover the next)
                ax.text(x + dur / 2e3, y, f"{kind}{m}.{j}", ha="center", va="center", fontsize=7)
        print(f"rank {rank}: " + " ".join(f"{k}{m}.{j}" for _, _, k, m, j in lane))
    parts = r.pipeline["parts"]
    other = [1, 2] if args.placement == "v" else [1, 3]
    ax.set_yticks([1, 0], [f"rank 0 · parts {parts}", f"rank 1 · parts {other}"])
    ax.set_xlabel("ms into the step (its trace)")
    ax.set_title(
        f"one {args.order} step, 2 stages x 2 chunks"
        f"{' in a V' if args.placement == 'v' else ''}, 4 microbatches: "
        "F/B/W of microbatch m through the rank's chunk j (light: chunk 0, dark: chunk 1)",
        fontsize=8.5,
    )
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    bubble = r.pipeline["bubble"]
    said = "not measured" if bubble is None else f"{bubble:.1%} of its step"
    print(f"wrote {args.out}; rank 0's bubble (its step's time with no F/B/W running): {said}")


if __name__ == "__main__":
    main()
