"""A model factory for a test DAG: rank ``rank`` SIGKILLs itself in its
``at_call``-th forward pass (a rank killed mid-training, as by the OOM killer)."""

from __future__ import annotations

import os
import signal

from torch import nn

from dagtrain.rank_env import env_rank
from dagtrain.training.rank.models import build_model


class Dying(nn.Module):
    def __init__(self, inner: nn.Module, dies: bool, at_call: int) -> None:
        super().__init__()
        self.inner = inner
        self.dies = dies
        self.at_call = at_call
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.dies and self.calls >= self.at_call:
            print(f"faulty_model: forward pass {self.calls}, this rank kills itself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(x)


def mlp_dying_on_rank(in_shape, classes, rank: int = 1, at_call: int = 6) -> nn.Module:
    inner = build_model("mlp", in_shape, classes, hidden=[16])
    return Dying(inner, env_rank() == str(rank), at_call)
