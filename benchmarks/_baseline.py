"""One rank of a baseline for train_throughput.py: DDP or Horovod's DistributedOptimizer,
on the same model, data and global batch as dagtrain. Started by torchrun / mpirun:

    python -m benchmarks._baseline SPEC_JSON RESULT_JSON
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn

from dagtrain.training.rank.data import load_dataset, shard_batches
from dagtrain.training.rank.models import build_model


def main() -> None:
    spec, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    kind = spec["kind"]
    if kind == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    ds = load_dataset("digits", 0.2, 0)
    torch.manual_seed(0)
    model = build_model(spec["model"], ds.in_shape, ds.classes, **spec["model_args"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if kind == "ddp":
        net = DistributedDataParallel(model)  # default: 25 MB buckets, overlapped
    else:
        net = model
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    times = []
    epoch = 0
    plan: list = []
    while len(times) < spec["steps"]:
        # timed from the batch on, as dagtrain's step is (its prefetch task cuts it)
        t = time.perf_counter()
        if not plan:
            plan = shard_batches(len(ds.x_train), spec["batch"], rank, world, 0, epoch)
            epoch += 1
        idx, _ = plan.pop(0)
        x, y = ds.x_train[idx], ds.y_train[idx]
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"kind": kind, "step_seconds": times}, f)
    if kind == "ddp":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
