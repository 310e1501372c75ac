"""What a training run would refuse at once, checked without training:

    python -m dagtrain.training.driver.preflight '{"model": {...}, "data": "...", "device": "cpu"}'

run with the environment the ranks will get (its ``DAGTRAIN_CODE_PATH``: the folders
of the DAG author's modules; ``dagtrain validate`` and ``dagtrain run`` start it so,
before Airflow starts), it checks ``distributed.device`` against this machine, reads the
data for its shape and classes, imports the model's factory, builds the model on
PyTorch's ``meta`` device (no memory, no weights) with ``model.args`` and passes a
batch of that shape through it (a small model: built again on the CPU, where the batch
passes faster than through the meta device's kernels). Data it cannot read is the
data-prep stage's to refuse, naming it, in the run: then the factory is imported and
``model.args`` bound to its signature only. It prints one JSON line: ``{"ok": true,
"in_shape": [...], "classes": C, "parameters": N, "samples": N or null}``, or
``{"ok": false, "error": "..."}`` whose message names the field; its exit code is 0
either way (1: it could not run).
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["check", "main"]


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """The checks; raises InputError or MissingDependency naming the field."""
    import torch

    from dagtrain.config import ModelConfig, ObjectiveConfig, TrainConfig, is_factory
    from dagtrain.errors import InputError
    from dagtrain.training.rank.data import data_form, read_arrays
    from dagtrain.training.rank.models import DataInfo, build_model, check_parameters
    from dagtrain.training.rank.objective import checked_loss, objective_of

    device = spec.get("device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "distributed.device is cuda but this machine has no CUDA device that torch can "
            f"use (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}): "
            "set distributed.device to cpu, or auto (CUDA where a host has it)"
        )
    if spec.get("precision") == "fp16" and device != "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"training.precision fp16 needs a CUDA device and this machine has none "
            f"(distributed.device {device}): use precision bf16 or fp32 here"
        )
    if spec.get("precision") == "bf16" and device == "cuda" and not torch.cuda.is_bf16_supported():
        raise InputError(
            f"training.precision bf16: this machine's GPU ({torch.cuda.get_device_name()}) "
            "has no bf16; use precision fp16 (with its gradient scaler) or fp32"
        )
    model_spec = spec["model"]
    objective_spec = ObjectiveConfig.model_validate(spec.get("objective") or {})
    objective = objective_of(objective_spec)
    metric = spec.get("metric")
    if metric and metric.removeprefix("test_") not in objective.metrics:
        names = ", ".join(f"test_{m}" for m in objective.metrics)
        raise InputError(
            f"evaluation.metric {metric!r}: objective {objective_spec.name!r} does not "
            f"report it; it reports {names}"
        )
    watched = spec.get("early_stopping_metric")
    if watched and watched not in objective.metrics:
        raise InputError(
            f"training.early_stopping.metric {watched!r}: objective {objective_spec.name!r} "
            f"does not report it; it reports {', '.join(objective.metrics)}"
        )
    form = data_form(
        TrainConfig(
            objective=objective_spec,
            sequence_length=spec.get("sequence_length"),
            vocab_size=spec.get("vocab_size"),
        )
    )
    sample: Any = None  # two samples (inputs, targets) of the data, where it is arrays
    samples = None  # how many the data has, where it is arrays (a text's windows)
    if is_factory(spec["data"]):  # the DAG author's code: imported and checked here
        in_shape, classes, sample = _factory_shape(spec["data"], spec.get("data_workers", 0), form)
    else:
        try:
            x, y, in_shape, classes = read_arrays(spec["data"], form)
        except InputError as e:
            if e.args and str(e.args[0]).startswith(("data.sequence_length", "objective.")):
                raise  # the fields of the config, not faults of the data
            # the data's own faults are prepare_data's to name, in the run
            return _signature(model_spec)
        sample = (torch.from_numpy(x[:2]), torch.from_numpy(y[:2]))
        samples = len(x)
    info = None
    if sample is not None:
        from dagtrain.training.rank.items import leaves

        x2, y2 = sample
        first = leaves(x2)[0][1]
        counted = classes  # None for a Dataset: prepare_data counts its classes
        if classes is None:  # at least what these samples need
            classes = _least_outputs(first, y2, form.targets)
        dtype = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
        info = DataInfo(
            tuple(in_shape),
            classes,
            dtype(first),
            tuple(y2.shape[1:]),
            dtype(y2),
            objective_spec.name,
        )
    args = model_spec.get("args", {})
    with torch.device("meta"):
        model = build_model(model_spec["name"], in_shape, classes or 2, info, **args)
    check_parameters(model, ModelConfig.model_validate(model_spec))
    # The batch passes through the model on the CPU where it is small (its weights a few
    # MB: built in milliseconds, and the meta device's kernels would cost more, importing
    # torch._dynamo and sympy, over a second); a large one on the meta device.
    device = "cpu" if _numel(model) <= CPU_FORWARD_PARAMETERS else "meta"
    with torch.device(device), torch.no_grad():
        try:
            if device == "cpu":
                model = build_model(model_spec["name"], in_shape, classes or 2, info, **args)
            # samples like data's (standardised), not zeros: a model whose ops need
            # varied input (a norm of the batch, an inverse) takes them as it will data;
            # token ids (integers) as they are
            given = sample is not None and (
                not isinstance(sample[0], torch.Tensor) or not sample[0].is_floating_point()
            )
            if given:  # token ids, a dict or tuple of inputs: the data's own samples
                from dagtrain.training.rank.batches import to_device

                batch = to_device(sample[0], torch.device(device))
            elif device == "cpu":
                batch = torch.randn(2, *in_shape, generator=torch.Generator().manual_seed(0))
            else:
                batch = torch.empty(2, *in_shape)  # shapes only
            out = model(batch)
        except InputError:  # the factory's own refusal (bad model.args), as on meta
            raise
        except NotImplementedError:  # an operator the meta device lacks: not checked
            out = None
        except Exception as e:
            raise InputError(
                f"model.name {model_spec['name']!r} with model.args {args}: "
                f"a batch of samples of shape {tuple(in_shape)} does not pass through the "
                f"model: {type(e).__name__}: {e}"
            ) from e
    parallel = spec.get("parallel") or {}
    if parallel.get("stages", 1) > 1:  # the blocks a pipeline splits it into
        from dagtrain.training.rank.split import check_blocks

        check_blocks(
            model, parallel["stages"], parallel.get("split", "auto"), parallel.get("chunks", 1)
        )
    if (
        out is not None
        and classes is not None
        and objective_spec.name == "classification"
        and tuple(out.shape) != (2, classes)
    ):
        raise InputError(
            f"model.name {model_spec['name']!r}: the model gives {tuple(out.shape[1:])} per "
            f"sample, not one logit per class ({classes} classes in data)"
        )
    if out is not None and sample is not None and out.device.type == "cpu":
        try:  # the objective's loss of the model's output: a scalar to start backward from
            checked_loss(objective, out.float().requires_grad_(), sample[1], objective_spec.name)
        except InputError:
            raise
        except Exception as e:
            raise InputError(
                f"objective.name {objective_spec.name!r}: its loss of the model's output "
                f"{tuple(out.shape)} on targets {tuple(sample[1].shape)} failed: "
                f"{type(e).__name__}: {e}"
            ) from e
    return {
        "ok": True,
        "in_shape": list(in_shape),
        "classes": counted if sample is not None else classes,
        "parameters": _numel(model),
        "samples": samples,
    }


CPU_FORWARD_PARAMETERS = 4_000_000  # 16 MB of fp32 weights


def _numel(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _factory_shape(spec: str, workers: int = 0, form: Any = None) -> tuple[Any, int | None, Any]:
    """A factory's samples' shape, classes (for arrays; a Dataset's are counted by the
    data-prep stage, which reads every item) and two samples ``(x, y)`` as tensors: a
    Dataset's first items read and checked against the objective; with ``workers``,
    that it pickles, as its worker processes receive it."""
    import torch

    from dagtrain.training.rank.data import open_source, read_arrays
    from dagtrain.training.rank.items import leaves
    from dagtrain.training.rank.samples import check_picklable, first_batch

    src = open_source(spec)
    if isinstance(src, tuple):
        x, y, in_shape, classes = read_arrays(spec, form)
        return in_shape, classes, (torch.from_numpy(x[:2]), torch.from_numpy(y[:2]))
    x, y = first_batch(spec, src, form.targets if form is not None else "any")
    if workers:
        check_picklable(spec, src)
    return tuple(leaves(x)[0][1].shape[1:]), None, (x, y)


def _least_outputs(x: Any, y: Any, targets: str) -> int:
    """The outputs a model needs for two samples of a Dataset whose classes are not
    counted yet: a regression target's size, else the largest class or id + 1."""
    import math

    if y.is_floating_point():
        return max(1, math.prod(y.shape[1:]))
    top = int(y.max()) if y.numel() else 1
    if targets == "tokens" and not x.is_floating_point() and x.numel():
        top = max(top, int(x.max()))
    return max(2, top + 1)


def _signature(model_spec: dict[str, Any]) -> dict[str, Any]:
    """Without the data's shape: the factory imported, ``model.args`` bound to its
    signature (InputError naming them if they do not bind)."""
    import inspect

    from dagtrain.errors import InputError
    from dagtrain.training.rank.models import factory_of

    name, args = model_spec["name"], model_spec.get("args", {})
    try:
        inspect.signature(factory_of(name)).bind(None, None, **args)
    except TypeError as e:
        raise InputError(f"model.args {args}: bad model_args for model {name!r}: {e}") from e
    return {"ok": True, "in_shape": None, "classes": None, "parameters": None}


def main(argv: list[str] | None = None) -> int:
    from dagtrain.errors import FAIL_FAST
    from dagtrain.rank_env import use_code_path

    use_code_path()  # as a rank does
    args = sys.argv[1:] if argv is None else argv
    try:
        result = check(json.loads(args[0]))
    except FAIL_FAST as e:
        result = {"ok": False, "error": str(e)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
