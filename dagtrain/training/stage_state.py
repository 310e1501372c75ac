"""A pipeline stage's part of the whole model's state: brought together on every rank
(parameters, buffers, optimizer state; broadcast from each stage's first replica), and
a checkpoint's optimizer state loaded into one stage.

The checkpoint's optimizer state has the data-parallel step's format: per parameter,
in reversed ``named_parameters`` order (the order backward fills the buckets in),
whatever the buckets or the split, so a checkpoint resumes on any number of stages or
without a pipeline. ``step`` is the :class:`~.pipeline.PipelineStep`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .step import make_optimizer

if TYPE_CHECKING:
    from .pipeline import PipelineStep

__all__ = ["gather_stages", "load_stage_states"]


def gather_stages(step: PipelineStep) -> list[dict[str, Any]]:
    """Every stage's parameters, buffers and optimizer state onto every rank (all
    ranks call it): broadcast from each stage's first replica."""
    optim: list[tuple[int, dict[str, Any]]] = []
    probe = make_optimizer(step.cfg, [nn.Parameter(torch.zeros(1))])
    hyper = {k: v for k, v in probe.state_dict()["param_groups"][0].items() if k != "params"}
    for s, (a, b) in enumerate(step.split.ranges):
        root = s * step.D
        stage = nn.Sequential(*step.blocks[a:b])
        tensors = [t for t in stage.state_dict(keep_vars=True).values()]
        step.backend.broadcast([t.data for t in tensors], root=root)
        states = _stage_states(step) if s == step.stage and step.replica == 0 else None
        layout = step.backend.broadcast_object(
            None
            if states is None
            else [[i, {k: _describe(v) for k, v in st.items()}] for i, st in states],
            root=root,
        )
        got: list[tuple[int, dict[str, Any]]] = []
        for i, desc in layout:
            st = {}
            for k, d in desc.items():
                if isinstance(d, dict) and "shape" in d:
                    t = (
                        dict(states)[i][k].contiguous()
                        if states is not None
                        else torch.empty(d["shape"], dtype=getattr(torch, d["dtype"]))
                    )
                    st[k] = t
                else:
                    st[k] = d
            got.append((i, st))
        tensors = [v for _, st in got for k, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
        step.backend.broadcast(tensors, root=root)
        optim.extend(got)
    per = dict(optim)
    n = len(step.global_params)
    return [
        {
            "state": {i: per[i] for i in range(n) if per.get(i)},
            "param_groups": [{**hyper, "params": list(range(n))}],
        }
    ]


def _stage_states(step: PipelineStep) -> list[tuple[int, dict[str, Any]]]:
    """This stage's optimizer state per parameter, by global parameter index."""
    if step.optimizer is None:
        return []
    state = step.optimizer.state_dict()["state"]
    return [
        (
            step.index[id(q)],
            {
                k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v)
                for k, v in state.get(j, {}).items()
            },
        )
        for j, q in enumerate(step.params)
    ]


def load_stage_states(step: PipelineStep, states: list[dict[str, Any]]) -> None:
    """Load the part of a checkpoint's optimizer state (any split's, or a data-parallel
    run's) that holds this stage's parameters."""
    per_param: list[dict[str, Any]] = []
    for st in states:
        for group in st["param_groups"]:
            per_param += [st["state"].get(i, st["state"].get(str(i), {})) for i in group["params"]]
    if len(per_param) != len(step.global_params):
        raise ValueError(
            f"the checkpoint's optimizer state has {len(per_param)} parameters, this "
            f"model {len(step.global_params)}: resume with the same model"
        )
    if step.optimizer is None:
        return
    hyper = {k: v for k, v in states[0]["param_groups"][0].items() if k != "params"}
    mine = {j: per_param[step.index[id(q)]] for j, q in enumerate(step.params)}
    for j, q in enumerate(step.params):
        for k, v in mine[j].items():
            if isinstance(v, torch.Tensor) and k != "step" and v.shape != q.shape:
                raise ValueError(
                    f"the checkpoint's optimizer state {k!r} of {step.names[j]} does not "
                    f"have the parameter's shape {tuple(q.shape)}: resume with the same model"
                )
    step.optimizer.load_state_dict(
        {
            "state": {j: st for j, st in mine.items() if st},
            "param_groups": [{**hyper, "params": list(range(len(step.params)))}],
        }
    )


def _describe(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
    return v
