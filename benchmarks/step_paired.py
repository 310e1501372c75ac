"""Per-op profile of dagtrain's step against Horovod's or DDP's, step by step in the
same two processes, so that the load of this shared machine falls on both alike.

    .venv/bin/python benchmarks/step_paired.py rescnn [--vs horovod|ddp] [--steps 100]
        [--variants '[{}, {"overlap": false}]']

Horovod runs under mpirun with dagtrain's MPI backend beside it; DDP under torchrun
with dagtrain's gloo backend. Each step: a barrier, one step of the baseline (timed:
forward, backward, Horovod's ``synchronize()``, the optimizer step), then, for each
variant (TrainConfig overrides; ``{}`` is the default config), a barrier and one step
of a StepGraph of its own model (timed per task from the executor's report: the data
of the Perfetto trace). Prints medians over the steps after WARMUP, per op, and the
median of the per-step difference to the baseline's step (negative: dagtrain faster).
This is how issue 12's findings in benchmarks/README.md were measured; the throughput
figures come from train_throughput.py, which runs every system on its own.
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

from benchmarks.train_throughput import MODELS, NPROCS, WARMUP, batch_of  # noqa: E402


def rank_main(spec: dict, out: str) -> None:
    """One rank: the baseline and every variant, step by step."""
    import torch
    from torch import nn

    from dagtrain.config import TrainConfig
    from dagtrain.training.rank.data import data_form, load_dataset, shard_batches
    from dagtrain.training.rank.models import build_model
    from dagtrain.training.rank.objective import LanguageModel
    from dagtrain.training.rank.step import StepGraph
    from dagtrain.training.rank.trainer import _batches

    torch.set_num_threads(1)
    model = MODELS[spec["model"]]
    batch = batch_of(spec["model"])
    data_args = {k: model[k] for k in ("data", "objective", "sequence_length") if k in model}
    if spec["vs"] == "horovod":
        import horovod.torch as hvd

        from dagtrain.sync.mpi import MPIBackend

        hvd.init()
        backend, name = MPIBackend(600), "mpi"
    else:
        from torch.nn.parallel import DistributedDataParallel

        from dagtrain.sync.torch_dist import TorchBackend

        backend, name = TorchBackend(600), "torch"
    rank, world = backend.rank, backend.size
    form = data_form(TrainConfig(**data_args))  # the data as dagtrain's trainer reads it
    ds = load_dataset(data_args.get("data", "digits"), 0.2, 0, True, form)
    lm = form.objective == "language_model"

    def build() -> nn.Module:
        torch.manual_seed(0)
        return build_model(model["model"], ds.in_shape, ds.classes, ds.info, **model["model_args"])

    base = build()
    opt = torch.optim.SGD(base.parameters(), lr=0.01, momentum=0.9)
    if spec["vs"] == "horovod":
        net = base
        hvd.broadcast_parameters(base.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=base.named_parameters())
    else:
        net = DistributedDataParallel(base)
    mean_ce, objective = nn.CrossEntropyLoss(), LanguageModel()

    def loss_fn(out, y, count):  # as _baseline.py's
        if lm:
            return objective.loss(out, y) * (world / (count * y.shape[1]))
        return mean_ce(out, y)

    plan: list = []
    epoch = 0

    def base_step() -> dict[str, float]:
        nonlocal plan, epoch
        t0 = time.perf_counter()
        if not plan:
            plan = shard_batches(len(ds.x_train), batch, rank, world, 0, epoch)
            epoch += 1
        idx, count = plan.pop(0)
        x, y = ds.x_train[idx], ds.y_train[idx]
        opt.zero_grad()
        loss = loss_fn(net(x), y, count)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if spec["vs"] == "horovod":
            opt.synchronize()
            t3 = time.perf_counter()
            with opt.skip_synchronize():
                opt.step()
        else:
            t3 = t2  # DDP waits for its allreduces inside backward
            opt.step()
        t4 = time.perf_counter()
        return {"step": t4 - t0, "forward": t1 - t0, "backward": t2 - t1, "sync": t3 - t2}

    graphs = []
    for overrides in spec["variants"]:
        cfg = TrainConfig(
            **{
                "backend": name,
                "ranks": NPROCS,
                "epochs": 1000,
                "batch_size": batch,
                "lr": 0.01,
                "workers": 2,
                "intra_op_threads": 1,
                "collective_timeout": 600,
                **model,
                **overrides,
            }
        )
        sg = StepGraph(cfg, build(), backend)
        batches = _batches(ds, cfg, rank, world, 0)
        sg.fetch = lambda batches=batches: next(batches, None)
        sg.prefetched = next(batches)
        sg.reports = []
        for g in {id(sg.graph): sg.graph, id(sg.plain_graph): sg.plain_graph}.values():
            g.run = _recording(g.run, sg.reports)
        graphs.append(sg)
    rows: dict[str, list] = {"base": []}
    for i in range(len(graphs)):
        rows[str(i)] = []
    for _ in range(spec["steps"]):
        backend.barrier()
        rows["base"].append(base_step())
        for i, sg in enumerate(graphs):
            backend.barrier()
            t0 = time.perf_counter()
            sg.run(sg.prefetched[2])
            wall = time.perf_counter() - t0
            r = sg.reports[-1]
            ops = {n: (s, e, w) for n, s, e, w in zip(r.names, r.starts, r.ends, r.workers_of)}
            rows[str(i)].append({"step": wall, "ops": ops})
    if rank == 0:
        info = [{"buckets": len(sg.buckets), "overlap": sg.overlap} for sg in graphs]
        Path(out).write_text(json.dumps({"rows": rows, "graphs": info}))
    backend.close()


def _recording(run, reports: list):
    """``run`` that also appends each RunReport to ``reports``."""

    def recorded(*args, **kwargs):
        reports.append(run(*args, **kwargs))
        return reports[-1]

    return recorded


def report(spec: dict, data: dict) -> None:
    base = data["rows"]["base"][WARMUP:]

    def med(values: list[float]) -> float:
        return 1000 * statistics.median(values)

    parts = ", ".join(f"{k} {med([b[k] for b in base]):.2f}" for k in base[0] if k != "step")
    print(f"{spec['model']}: {spec['vs']} step {med([b['step'] for b in base]):.2f} ms ({parts})")
    for i, overrides in enumerate(spec["variants"]):
        rows = data["rows"][str(i)][WARMUP:]
        diff = med([r["step"] - b["step"] for r, b in zip(rows, base)])
        info = data["graphs"][i]
        print(
            f"  dagtrain {json.dumps(overrides)}: step {med([r['step'] for r in rows]):.2f} ms, "
            f"paired difference {diff:+.2f} ms; {info['buckets']} bucket(s), "
            f"overlap {'possible' if info['overlap'] else 'off'}"
        )
        kinds: dict[tuple, list] = {}
        for r in rows:  # the overlapped and the plain steps apart (the overlap trial)
            kinds.setdefault(tuple(r["ops"]), []).append(r["ops"])
        for names, runs in kinds.items():
            print(f"    {len(runs)} steps of tasks {', '.join(names)}:")
            for n in names:
                start = med([o[n][0] for o in runs])
                dur = med([o[n][1] - o[n][0] for o in runs])
                lanes = sorted({o[n][2] for o in runs})
                print(f"      {n:18s} start {start:8.2f}  duration {dur:7.2f} ms  threads {lanes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=list(MODELS))
    ap.add_argument("--vs", choices=["horovod", "ddp"], default="horovod")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--variants", default="[{}]", help="JSON list of TrainConfig overrides")
    ap.add_argument("--rank", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank[0]), args.rank[1])
        return
    from dagtrain.launch import launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spec = {
        "model": args.model,
        "vs": args.vs,
        "steps": args.steps + WARMUP,
        "variants": json.loads(args.variants),
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "paired.json")
        launch(
            ["benchmarks.step_paired", args.model, "--rank", json.dumps(spec), out],
            NPROCS,
            "mpirun" if args.vs == "horovod" else "torchrun",
            on_line=lambda line: None,
            timeout=3600,
        )
        report(spec, json.loads(Path(out).read_text()))


if __name__ == "__main__":
    main()
