"""What a pipeline rank's checkpoint holds of its stage, and what it loads back: the
optimizer state of the stage's parameters in the data-parallel format (per parameter,
by global index), and the list of the other stages' shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dagtrain.records.names import SHARD

from .optimizers import make_optimizer
from .split import blocks_of
from .stages import stage_blocks

if TYPE_CHECKING:
    from dagtrain.config import TrainConfig

    from .split import Split


class StageState:
    """The checkpoint's side of :class:`~.pipelining.StageStep` (its base)."""

    cfg: TrainConfig
    model: nn.Module
    S: int
    split: Split
    keys: list[list[str]]
    names: list[str]
    params: list[nn.Parameter]
    global_params: list[nn.Parameter]
    index: dict[int, int]
    optimizer: torch.optim.Optimizer | None

    def optimizer_states(self) -> list[dict[str, Any]]:
        """This stage's part of the whole model's optimizer state (its parameters'
        entries, by global index). Its tensors are the live state: copy to keep."""
        n = len(self.global_params)
        if self.optimizer is not None:
            hyper = self.optimizer.state_dict()["param_groups"][0]
        else:  # a stage with no parameters: the optimizer's defaults
            hyper = make_optimizer(self.cfg, [nn.Parameter(torch.zeros(1))]).state_dict()[
                "param_groups"
            ][0]
        hyper = {k: v for k, v in hyper.items() if k != "params"}
        return [
            {
                "state": {i: st for i, st in self._stage_states() if st},
                "param_groups": [{**hyper, "params": list(range(n))}],
            }
        ]

    def shards(self, step: int) -> list[dict[str, Any]]:
        """What a checkpoint of ``step`` lists of the other stages' shards (stage 0's
        part is the checkpoint's own file): each one's file, keys and parameters."""
        blocks = blocks_of(self.model)
        stage_of = {
            id(q): s
            for s in range(self.S)
            for blk in stage_blocks(blocks, self.split, s)
            for q in blk.parameters()
        }
        return [
            {
                "file": SHARD(step=step, stage=s),
                "stage": s,
                "keys": self.keys[s],
                "params": [i for i, q in enumerate(self.global_params) if stage_of[id(q)] == s],
            }
            for s in range(1, self.S)
        ]

    def _stage_states(self) -> list[tuple[int, dict[str, Any]]]:
        """This stage's optimizer state per parameter, by global parameter index."""
        if self.optimizer is None:
            return []
        state = self.optimizer.state_dict()["state"]
        return [(self.index[id(q)], dict(state.get(j, {}))) for j, q in enumerate(self.params)]

    def load_optimizer_states(self, states: list[dict[str, Any]]) -> None:
        """Load the part of a checkpoint's optimizer state (any split's, or a
        data-parallel run's) that holds this stage's parameters."""
        per_param: list[dict[str, Any]] = []
        for st in states:
            for group in st["param_groups"]:
                per_param += [
                    st["state"].get(i, st["state"].get(str(i), {})) for i in group["params"]
                ]
        if len(per_param) != len(self.global_params):
            raise ValueError(
                f"the checkpoint's optimizer state has {len(per_param)} parameters, this "
                f"model {len(self.global_params)}: resume with the same model"
            )
        if self.optimizer is None:
            return
        hyper = {k: v for k, v in states[0]["param_groups"][0].items() if k != "params"}
        # each parameter its own step count: a data-parallel checkpoint's parameters of
        # one bucket share one (its flat optimizer's), which Adam would count up once
        # for each of them
        mine = {
            j: {
                k: v.clone() if k == "step" and isinstance(v, torch.Tensor) else v
                for k, v in per_param[self.index[id(q)]].items()
            }
            for j, q in enumerate(self.params)
        }
        for j, q in enumerate(self.params):
            for k, v in mine[j].items():
                if isinstance(v, torch.Tensor) and k != "step" and v.shape != q.shape:
                    raise ValueError(
                        f"the checkpoint's optimizer state {k!r} of {self.names[j]} does not "
                        f"have the parameter's shape {tuple(q.shape)}: resume with the same model"
                    )
        self.optimizer.load_state_dict(
            {
                "state": {j: st for j, st in mine.items() if st},
                "param_groups": [{**hyper, "params": list(range(len(self.params)))}],
            }
        )
