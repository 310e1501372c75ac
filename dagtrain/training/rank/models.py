"""Models: a registry of built-ins, and user models by a factory's import path.

Built-ins take the input shape and the number of classes: ``mlp`` (hidden layers),
``cnn`` (two conv layers), ``rescnn`` (a small residual CNN), ``transformer`` (a
small transformer encoder classifier over rows of the input). A user model is
``"package.module:function"``; the function gets ``in_shape``, ``classes`` and the
config's ``model_args`` and returns a ``torch.nn.Module``, or a list of modules run in
sequence (an ``nn.Sequential`` of them, which a pipeline can split).
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, get_args

import torch
from torch import nn

from dagtrain.config import BuiltinModel, ModelConfig
from dagtrain.errors import InputError

__all__ = ["MODELS", "build_model", "evaluate", "factory_of"]


def mlp(
    in_shape: Sequence[int], classes: int, hidden: Sequence[int] = (256, 256), dropout: float = 0.0
) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(in_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def _image(in_shape: Sequence[int]) -> tuple[int, int, int]:
    if len(in_shape) == 3:
        return tuple(in_shape)  # type: ignore[return-value]
    side = math.isqrt(math.prod(in_shape))
    if side * side != math.prod(in_shape):
        raise InputError(f"a CNN needs an image input (C, H, W) or a square, not {in_shape}")
    return (1, side, side)


class _Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


def cnn(in_shape: Sequence[int], classes: int, channels: int = 32) -> nn.Module:
    c, h, w = _image(in_shape)
    return nn.Sequential(
        _Reshape((c, h, w)),
        nn.Conv2d(c, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(channels * 16, classes),
    )


class _Block(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.n1 = nn.BatchNorm2d(ch)
        self.c2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.n2 = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.n1(self.c1(x)))
        return torch.relu(x + self.n2(self.c2(y)))


def rescnn(in_shape: Sequence[int], classes: int, channels: int = 32, blocks: int = 3) -> nn.Module:
    c, h, w = _image(in_shape)
    return nn.Sequential(
        _Reshape((c, h, w)),
        nn.Conv2d(c, channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        *[_Block(channels) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels, classes),
    )


class _Encoder(nn.Module):
    """Rows of the input are the tokens: (N, rows, cols) -> classes."""

    def __init__(self, rows: int, cols: int, classes: int, dim: int, heads: int, layers: int):
        super().__init__()
        self.rows, self.cols = rows, cols
        self.embed = nn.Linear(cols, dim)
        self.pos = nn.Parameter(torch.zeros(1, rows, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x.reshape(x.shape[0], self.rows, self.cols)) + self.pos
        return self.head(self.encoder(t).mean(dim=1))

    def blocks(self) -> list[nn.Module]:
        """The blocks a pipeline splits it into, run in sequence: the embedding, each
        encoder layer, the pooling head. They share this model's parameters."""
        return [
            _Embed(self.embed, self.pos, self.rows, self.cols),
            *self.encoder.layers,
            _Pool(self.head),
        ]


class _Embed(nn.Module):
    def __init__(self, embed: nn.Linear, pos: nn.Parameter, rows: int, cols: int) -> None:
        super().__init__()
        self.embed, self.pos, self.rows, self.cols = embed, pos, rows, cols

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x.reshape(x.shape[0], self.rows, self.cols)) + self.pos


class _Pool(nn.Module):
    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.head(t.mean(dim=1))


def transformer(
    in_shape: Sequence[int], classes: int, dim: int = 64, heads: int = 4, layers: int = 2
) -> nn.Module:
    if len(in_shape) >= 2:
        rows, cols = in_shape[-2], in_shape[-1]
    else:
        side = math.isqrt(in_shape[0])
        rows, cols = (side, side) if side * side == in_shape[0] else (1, in_shape[0])
    return _Encoder(rows, cols, classes, dim, heads, layers)


# the built-ins, by the names the config lists (dagtrain.config.BuiltinModel)
MODELS: dict[str, Callable[..., nn.Module]] = {
    name: globals()[name] for name in get_args(BuiltinModel)
}


def _code_path() -> list[str]:
    from dagtrain.rank_env import CODE_PATH

    return [f for f in os.environ.get(CODE_PATH, "").split(os.pathsep) if f]


def factory_of(name: str) -> Callable[..., nn.Module]:
    """The model factory ``name`` names: a built-in, or ``"pkg.module:factory"``
    imported; InputError naming ``model.name`` and where it looked otherwise."""
    if name in MODELS:
        return MODELS[name]
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            if isinstance(e, AttributeError):
                why = f"module {mod!r} has no {attr!r}"
            elif isinstance(e, ModuleNotFoundError) and e.name == mod.partition(".")[0]:
                why = f"no module {mod!r} can be imported here ({e})"
            else:
                why = f"importing {mod!r} failed here: {type(e).__name__}: {e}"
            where = os.pathsep.join(
                [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *_code_path()]
            ).strip(os.pathsep)
            raise InputError(
                f"model.name {name!r}: cannot import {attr!r} from {mod!r} ({why}); "
                f"looked in the installed packages, the current folder ({os.getcwd()})"
                f"{' and ' + where if where else ''}. "
                "Put the module next to "
                "the config or DAG file (or in Airflow's plugins folder), or install it "
                "where the ranks run"
            ) from e
    raise InputError(
        f"model {name!r} is neither a built-in ({', '.join(MODELS)}) "
        "nor an import path 'package.module:factory'"
    )


def build_model(name: str, in_shape: Sequence[int], classes: int, **args) -> nn.Module:
    """A built-in by name, or ``"pkg.module:factory"``; errors say what is allowed."""
    factory = factory_of(name)
    try:
        model = factory(in_shape, classes, **args)
    except (TypeError, ValueError, RuntimeError) as e:  # torch: "negative dimension -8"
        raise InputError(f"model.args {args}: bad model_args for model {name!r}: {e}") from e
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, nn.Module) for m in model):
        model = nn.Sequential(*model)  # blocks in sequence: a pipeline can split them
    if not isinstance(model, nn.Module):
        raise InputError(
            f"model {name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def bounded_model(spec: ModelConfig, in_shape: Sequence[int], classes: int) -> nn.Module:
    """The model ``spec`` describes, refused (InputError naming ``model.args``) before
    any memory is spent if it has more than ``model.max_parameters`` parameters: it is
    built first on the meta device (no memory, no weights) and counted. A factory that
    cannot build on the meta device is counted once built."""
    try:  # (the generators' state kept: the real build draws what it did without this)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            sized = build_model(spec.name, in_shape, classes, **spec.args)
    except InputError:
        raise
    except Exception:  # a factory that needs real tensors: counted after
        sized = None
    if sized is not None:
        check_parameters(sized, spec)
    model = build_model(spec.name, in_shape, classes, **spec.args)
    if sized is None:
        check_parameters(model, spec)
    return model


def check_parameters(model: nn.Module, spec: ModelConfig) -> int:
    """``model``'s parameter count; InputError if over ``spec.max_parameters``."""
    n = sum(p.numel() for p in model.parameters())
    if n > spec.max_parameters:
        raise InputError(
            f"model.args {spec.args}: model {spec.name!r} would have {n:,} parameters, "
            f"more than model.max_parameters ({spec.max_parameters:,}, set in the config "
            "file): use smaller model.args, or have the DAG's author raise "
            "model.max_parameters if the workers have the memory"
        )
    return n


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, split: str = "test"
) -> dict[str, float]:
    """``{split}_loss`` (cross-entropy), ``{split}_accuracy``, ``{split}_correct`` and
    ``{split}_samples`` of ``model`` on ``(x, y)``, in eval mode; ``split`` names the
    data (``val`` or ``test``). The accuracy is the exact fraction of the counts
    (correct / samples, in float64): 27 right of 30 is 0.9, not float32's 0.89999998."""
    model.eval()
    first = next(model.parameters(), None)
    if first is not None and first.device != x.device:  # a GPU model, host data
        x, y = x.to(first.device), y.to(first.device)
    with torch.no_grad():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y).item()
        correct = int((out.argmax(dim=1) == y).sum().item())
    samples = len(y)
    return {
        f"{split}_loss": loss,
        f"{split}_accuracy": correct / samples if samples else 0.0,
        f"{split}_correct": correct,
        f"{split}_samples": samples,
    }


# the most samples evaluated in one forward pass: a larger split is summed over batches
EVAL_BATCH = 4096


def evaluate_samples(model: nn.Module, samples: Any, split: str = "test") -> dict[str, float]:
    """:func:`evaluate` on a split's samples (:mod:`.samples`): arrays at once; a
    Dataset's read ``EVAL_BATCH`` at a time (one pass when it holds no more, so the same
    samples give the same figures either way)."""
    from .samples import ArraySamples, evaluate_batches

    if isinstance(samples, ArraySamples):
        return evaluate(model, samples.x, samples.y, split)
    parts = [evaluate(model, x, y, split) for x, y in evaluate_batches(samples, EVAL_BATCH)]
    if len(parts) == 1:
        return parts[0]
    n = sum(p[f"{split}_samples"] for p in parts)
    correct = sum(p[f"{split}_correct"] for p in parts)
    return {
        f"{split}_loss": sum(p[f"{split}_loss"] * p[f"{split}_samples"] for p in parts) / max(n, 1),
        f"{split}_accuracy": correct / n if n else 0.0,
        f"{split}_correct": correct,
        f"{split}_samples": n,
    }
