"""A hand-made pipeline-parallel run folder, laid out as ``ArtifactLayout`` says: a
result with ``pipeline``, rank records with ``stage`` and ``replica``, and step traces
whose ops are named as the pipelined step names them (``F{m}``, ``B{m}``, ``W{m}``,
``send-act{m}``, ``recv-act{m}``, ``send-grad{m}``, ``recv-grad{m}``, ``allreduce[k]``,
``update``, ``load-next``), timed by a small list scheduler of the order's op sequence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dagtrain.records.layout import ArtifactLayout

DAG = "dagtrain_pp"  # the DAG whose runs the page tests show

F_US, B_US, W_US, COMM_US = 1000.0, 1400.0, 600.0, 150.0


def stage_order(order: str, stages: int, s: int, m: int) -> list[tuple[str, int]]:
    """The forwards and backwards stage ``s`` runs, in order (zero-bubble's weight
    gradients fill its gaps: ``schedule``)."""
    if order == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - s - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m):
        if warm + i < m:
            ops.append(("F", warm + i))
        ops.append(("B", i))
    return ops


def schedule(order: str, stages: int, m: int) -> dict[tuple[str, int, int], tuple[float, float]]:
    """{(kind, stage, microbatch): (start, end)} in microseconds; zero-bubble runs a
    pending W whenever its stage would otherwise wait, and the rest at the end."""
    zb = order == "zero-bubble"
    dur = {"F": F_US, "B": B_US - W_US if zb else B_US, "W": W_US}
    seqs = {s: stage_order(order, stages, s, m) for s in range(stages)}
    at: dict[tuple[str, int, int], tuple[float, float]] = {}
    pos = dict.fromkeys(range(stages), 0)
    free = dict.fromkeys(range(stages), 0.0)
    pending: dict[int, list[int]] = {s: [] for s in range(stages)}

    def put(kind: str, s: int, i: int, start: float) -> None:
        at[(kind, s, i)] = (start, start + dur[kind])
        free[s] = start + dur[kind]

    while any(pos[s] < len(seqs[s]) for s in seqs):
        moved = False
        for s in range(stages):
            if pos[s] >= len(seqs[s]):
                continue
            kind, i = seqs[s][pos[s]]
            if kind == "F":
                dep = None if s == 0 else ("F", s - 1, i)
            else:
                dep = ("F", s, i) if s == stages - 1 else ("B", s + 1, i)
            if dep is not None and dep not in at:
                continue
            ready = 0.0 if dep is None else at[dep][1] + (COMM_US if dep[1] != s else 0)
            if pending[s] and ready >= free[s] + dur["W"]:
                put("W", s, pending[s].pop(0), free[s])
                moved = True
                continue
            put(kind, s, i, max(free[s], ready))
            if zb and kind == "B":
                pending[s].append(i)
            pos[s] += 1
            moved = True
        assert moved, "the order deadlocks"
    for s in range(stages):
        for i in pending[s]:
            put("W", s, i, free[s])
    return at


def rank_events(
    rank: int, s: int, stages: int, m: int, order: str, replicas: int
) -> list[dict[str, Any]]:
    at = schedule(order, stages, m)
    ev: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": rank,
            "tid": 0,
            "args": {"name": f"rank {rank}"},
        },
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "caller"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "worker 1"}},
    ]
    index = 0

    def op(name: str, ts: float, dur: float, tid: int = 0) -> None:
        nonlocal index
        ev.append(
            {
                "ph": "X",
                "name": name,
                "cat": "task",
                "pid": rank,
                "tid": tid,
                "ts": 10_000 + ts,
                "dur": dur,
                "args": {"index": index, "state": "done"},
            }
        )
        index += 1

    for (kind, st, i), (a, b) in sorted(at.items(), key=lambda kv: kv[1]):
        if st != s:
            continue
        op(f"{kind}{i}", a, b - a)
        if kind == "F" and s < stages - 1:
            op(f"send-act{i}", b, COMM_US, 1)
        if kind == "F" and s > 0:
            op(f"recv-act{i}", a - COMM_US, COMM_US, 1)
        if kind == "B" and s > 0:
            op(f"send-grad{i}", b, COMM_US, 1)
        if kind == "B" and s < stages - 1:
            op(f"recv-grad{i}", a - COMM_US, COMM_US, 1)
    end = max(b for (_, st, _), (_, b) in at.items() if st == s)
    if s == 0:
        op("load-next", 0, 2 * F_US, 1)
    if replicas > 1:
        op("allreduce[0]", end, 500, 1)
        end += 500
    op("update", end, 300)
    return ev


def make_pipeline_run(
    tmp_path: Path,
    run_id: str = "manual__pp",
    stages: int = 2,
    replicas: int = 1,
    microbatches: int = 4,
    order: str = "1f1b",
    with_result: bool = True,
    steps: tuple[int | None, ...] = (None,),
) -> tuple[Path, dict[str, Any]]:
    """A pipeline-parallel run under ``tmp_path/art/p``: rank r is stage r % S of
    replica r // S; returns (artifact root, the prepare_data output)."""
    root = tmp_path / "art" / "p"
    (root / "data" / "v1").mkdir(parents=True, exist_ok=True)
    train = ArtifactLayout(root, DAG).run(run_id).train
    train.traces.mkdir(parents=True, exist_ok=True)
    train.ranks.mkdir(parents=True, exist_ok=True)
    world = stages * replicas
    lines = [
        {"kind": "start", "step": 0, "total_steps": 40, "steps_per_epoch": 20, "time": 1.0},
        {"kind": "epoch", "epoch": 0, "train_loss": 1.0, "val_loss": 0.9, "val_accuracy": 0.6},
        {"kind": "epoch", "epoch": 1, "train_loss": 0.6, "val_loss": 0.5, "val_accuracy": 0.8},
    ]
    train.metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    train.config.write_text(
        json.dumps(
            {
                "training": {"lr": 0.1, "epochs": 2, "batch_size": 64},
                "distributed": {"backend": "torch", "ranks": world},
                "parallel": {"stages": stages, "microbatches": microbatches, "order": order},
            }
        )
    )
    for r in range(world):
        s, d = r % stages, r // stages
        train.ranks.joinpath(f"rank{r}.json").write_text(
            json.dumps(
                {
                    "rank": r,
                    "host": "h0",
                    "status": "done",
                    "step": 40,
                    "total_steps": 40,
                    "samples_per_second": 900.0 - 10 * r,
                    "median_step_ms": 12.0 + r,
                    "p95_step_ms": 15.0 + r,
                    "stage": s,
                    "replica": d,
                }
            )
        )
        ev = rank_events(r, s, stages, microbatches, order, replicas)
        for step in steps:
            name = f"step-rank{r}.json" if step is None else f"step{step:07d}-rank{r}.json"
            (train.traces / name).write_text(json.dumps({"traceEvents": ev}))
    if with_result:
        bounds = [3 * (k + 1) for k in range(stages - 1)]
        train.result.write_text(
            json.dumps(
                {
                    "world": world,
                    "steps": 40,
                    "val_accuracy": 0.8,
                    "samples_per_second": 880.0,
                    "median_step_seconds": 0.012,
                    "skipped_steps": 0,
                    "bucket_bytes": [1 << 20] if replicas > 1 else [],
                    "pipeline": {
                        "stages": stages,
                        "replicas": replicas,
                        "microbatches": microbatches,
                        "order": order,
                        "split": bounds,
                        "stage": 0,
                        "peak_activation_bytes": 3 << 20,
                        "bubble": None,
                        "blocks": [f"block{k}" for k in range(3 * stages)],
                        "stage_costs": [0.004] * stages,
                    },
                }
            )
        )
    return root, {"dir": str(root / "data" / "v1"), "version": "v1", "rows": {"train": 9}}
