"""One rank of a baseline for train_throughput.py: DDP or Horovod's DistributedOptimizer,
on the same model, data and global batch as dagtrain. Started by torchrun / mpirun:

    python -m benchmarks._baseline SPEC_JSON RESULT_JSON

The spec names the model and its arguments, the global batch and steps, and for a
language model the text (``data``), ``sequence_length`` and ``objective``. The data is
dagtrain's own (``load_dataset`` with the run's ``DataForm``: the same split, the same
windows of a text), the model dagtrain's ``build_model`` with the data's ``DataInfo``
(seed 0, as dagtrain's trainer builds it), the batches dagtrain's ``shard_batches``.

The loss: digits, cross-entropy's mean over the rank's samples; a language model,
``LanguageModel.loss`` (token cross-entropy summed) times world / the global batch's
tokens, as dagtrain's step scales it: averaged over the ranks (DDP, Horovod), the sum of
every token's loss over the global batch's tokens.

Rank 0 writes every step's seconds and, per step, the seconds of its phases: ``batch``
(cut from the dataset), ``forward`` (with the loss), ``backward`` (DDP's allreduces
overlap it; Horovod's start from its hooks) and ``step`` (Horovod's ``synchronize()``,
then the update).
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn

from dagtrain.training.rank.data import DataForm, load_dataset, shard_batches
from dagtrain.training.rank.models import build_model
from dagtrain.training.rank.objective import LanguageModel


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
    lm = spec.get("objective") == "language_model"
    form = DataForm("tokens", spec["sequence_length"], objective="language_model") if lm else None
    ds = load_dataset(spec.get("data", "digits"), 0.2, 0, True, form)
    x_train, y_train = ds.x_train, ds.y_train
    torch.manual_seed(0)
    model = build_model(spec["model"], ds.in_shape, ds.classes, ds.info, **spec["model_args"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if kind == "ddp":
        net = DistributedDataParallel(model)  # default: 25 MB buckets, overlapped
    else:
        net = model
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    objective = LanguageModel()
    mean_ce = nn.CrossEntropyLoss()
    times: list[float] = []
    phases: list[dict[str, float]] = []
    epoch = 0
    plan: list = []
    clock = time.perf_counter
    while len(times) < spec["steps"]:
        # timed from the batch on, as dagtrain's step is (its prefetch task cuts it)
        t0 = clock()
        if not plan:
            plan = shard_batches(len(x_train), spec["batch"], rank, world, 0, epoch)
            epoch += 1
        idx, count = plan.pop(0)
        x, y = x_train[idx], y_train[idx]
        t1 = clock()
        opt.zero_grad()
        out_ = net(x)
        if lm:  # dagtrain's scaled_loss: the sum, times world / the global tokens
            loss = objective.loss(out_, y) * (world / (count * y.shape[1]))
        else:
            loss = mean_ce(out_, y)
        t2 = clock()
        loss.backward()
        t3 = clock()
        opt.step()
        t4 = clock()
        times.append(t4 - t0)
        phases.append({"batch": t1 - t0, "forward": t2 - t1, "backward": t3 - t2, "step": t4 - t3})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"kind": kind, "step_seconds": times, "phase_seconds": phases}, f)
    if kind == "ddp":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
