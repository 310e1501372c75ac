"""Models: a registry of built-ins, and user models by a factory's import path.

Built-ins take the input shape and the number of outputs (``classes``: the classes, a
regression target's size, or the vocabulary): ``mlp`` (hidden layers), ``cnn`` (two
conv layers), ``rescnn`` (a small residual CNN), ``transformer`` (a small transformer
encoder over rows of the input; over token ids, a causal language model). A user model
is ``"package.module:function"``; the function gets ``in_shape``, ``classes``, the
config's ``model.args`` and, if it has a parameter named ``data``, a :class:`DataInfo`,
and returns a ``torch.nn.Module``, or a list of modules run in sequence (an
``nn.Sequential`` of them, which a pipeline can split).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import torch
from torch import nn

from dagtrain.config import BuiltinModel, ModelConfig
from dagtrain.errors import InputError

from .factories import import_factory
from .objective import Classification, Objective

__all__ = [
    "MODELS",
    "DataInfo",
    "build_model",
    "construct",
    "evaluate",
    "factory_of",
    "output_sums",
    "split_metrics",
]


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


class _CausalLM(nn.Module):
    """A causal language model: (N, L) token ids -> (N, L, vocab) logits of each next
    token. Token embedding and learned positions, pre-norm self-attention blocks that
    see only earlier positions, a final norm and a head to the vocabulary."""

    def __init__(self, vocab: int, length: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.length = length
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, length, dim))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim * 4, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).layers
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks():
            x = block(x)
        return x

    def blocks(self) -> list[nn.Module]:
        """The embedding, each attention block, the head: a pipeline's blocks, sharing
        this model's parameters."""
        return [
            _TokenEmbed(self.embed, self.pos),
            *(_Causal(layer) for layer in self.layers),
            _Head(self.norm, self.head),
        ]


class _TokenEmbed(nn.Module):
    def __init__(self, embed: nn.Embedding, pos: nn.Parameter) -> None:
        super().__init__()
        self.embed, self.pos = embed, pos

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x) + self.pos[:, : x.shape[1]]


class _Causal(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=t.device), diagonal=1)
        return self.layer(t, src_mask=mask, is_causal=True)


class _Head(nn.Module):
    def __init__(self, norm: nn.LayerNorm, head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(t))


def transformer(
    in_shape: Sequence[int],
    classes: int,
    dim: int = 64,
    heads: int = 4,
    layers: int = 2,
    data: DataInfo | None = None,
) -> nn.Module:
    """Over token ids (``data.tokens``): a causal language model with a vocabulary of
    ``classes``. Over features: an encoder classifier (or regressor) reading the rows
    of each sample as its tokens."""
    if data is not None and data.tokens:
        return _CausalLM(classes, in_shape[-1], dim, heads, layers)
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


def factory_of(name: str) -> Callable[..., nn.Module]:
    """The model factory ``name`` names: a built-in, or ``"pkg.module:factory"``
    imported; InputError naming ``model.name`` and where it looked otherwise."""
    if name in MODELS:
        return MODELS[name]
    if ":" in name:
        return import_factory(name, "model.name")
    raise InputError(
        f"model {name!r} is neither a built-in ({', '.join(MODELS)}) "
        "nor an import path 'package.module:factory'"
    )


@dataclass(frozen=True)
class DataInfo:
    """What a model factory may learn of the data besides ``(in_shape, classes)``: a
    factory with a parameter named ``data`` gets it. ``classes``: the classes, the
    vocabulary (token inputs) or the size of a sample's target (regression)."""

    in_shape: tuple[int, ...]
    classes: int
    in_dtype: str = "float32"
    target_shape: tuple[int, ...] = ()
    target_dtype: str = "int64"
    objective: str = "classification"

    @classmethod
    def of(cls, manifest: dict[str, Any], objective: str) -> DataInfo:
        """From a data-prep manifest (one written before these fields: float features,
        integer classes)."""
        return cls(
            tuple(manifest["in_shape"]),
            int(manifest["classes"]),
            manifest.get("in_dtype", "float32"),
            tuple(manifest.get("target_shape", ())),
            manifest.get("target_dtype", "int64"),
            objective,
        )

    @property
    def tokens(self) -> bool:
        """Whether the inputs are a language model's token ids: integers, and the
        objective ``language_model`` (an author's objective on integers builds its own
        model)."""
        return self.objective == "language_model" and self.in_dtype.startswith(("int", "uint"))


def build_model(
    name: str, in_shape: Sequence[int], classes: int, data: DataInfo | None = None, **args
) -> nn.Module:
    """A built-in by name, or ``"pkg.module:factory"``; errors say what is allowed.
    ``data`` reaches a factory that has a parameter named ``data``."""
    try:
        return construct(name, in_shape, classes, data, **args)
    except InputError:  # (what construct says itself)
        raise
    except (TypeError, ValueError, RuntimeError) as e:  # torch: "negative dimension -8"
        raise InputError(f"model.args {args}: bad model_args for model {name!r}: {e}") from e


def construct(
    name: str, in_shape: Sequence[int], classes: int, data: DataInfo | None = None, **args
) -> nn.Module:
    """:func:`build_model` with the factory's own errors as they are (a pipeline stage's
    build: :mod:`.materialize` says why it cannot build one stage alone)."""
    factory = factory_of(name)
    if data is not None and _takes_data(factory):
        args = {**args, "data": data}
    model = factory(in_shape, classes, **args)
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, nn.Module) for m in model):
        model = nn.Sequential(*model)  # blocks in sequence: a pipeline can split them
    if not isinstance(model, nn.Module):
        raise InputError(
            f"model {name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def _takes_data(factory: Callable[..., Any]) -> bool:
    try:
        return "data" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: none
        return False


def bounded_model(
    spec: ModelConfig, in_shape: Sequence[int], classes: int, data: DataInfo | None = None
) -> nn.Module:
    """The model ``spec`` describes, refused (InputError naming ``model.args``) before
    any memory is spent if it has more than ``model.max_parameters`` parameters: it is
    built first on the meta device (no memory, no weights) and counted. A factory that
    cannot build on the meta device is counted once built."""
    try:  # (the generators' state kept: the real build draws what it did without this)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            sized = build_model(spec.name, in_shape, classes, data, **spec.args)
    except InputError:
        raise
    except Exception:  # a factory that needs real tensors: counted after
        sized = None
    if sized is not None:
        check_parameters(sized, spec)
    model = build_model(spec.name, in_shape, classes, data, **spec.args)
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
    model: nn.Module, x: Any, y: Any, split: str = "test", objective: Objective | None = None
) -> dict[str, float]:
    """The objective's metrics of ``model`` on ``(x, y)`` (default: classification's),
    in eval mode, each named ``{split}_<metric>``; ``split`` names the data (``val`` or
    ``test``). Beside them, the sums they come from: ``{split}_<tally>`` (``_correct``:
    an int), ``{split}_units`` and ``{split}_samples``. An accuracy is the exact
    fraction of the counts (correct / units, in float64): 27 right of 30 is 0.9, not
    float32's 0.89999998."""
    return split_metrics(_sums(model, x, y, objective or Classification()), split, objective)


def _sums(model: nn.Module, x: Any, y: Any, objective: Objective) -> dict[str, float]:
    """The objective's sums of ``model`` on one batch, and its samples."""
    from .batches import to_device

    model.eval()
    first = next(model.parameters(), None)
    if first is not None and first.device.type != "cpu":  # a GPU model, host data
        x, y = to_device(x, first.device), to_device(y, first.device)
    with torch.no_grad():
        return output_sums(model(x), y, objective)


def output_sums(out: torch.Tensor, y: Any, objective: Objective) -> dict[str, float]:
    """The objective's sums of a model's output ``out`` on targets ``y`` (on out's
    device), and the samples: what :func:`split_metrics` turns into the metrics."""
    with torch.no_grad():
        sums = {"loss": objective.loss(out, y).item()}
        tallied = objective.tally(out, y)
    sums.update(
        (k, v if isinstance(v, (int, float)) else float(v))
        for k, v in zip(objective.tallies, tallied)
    )
    return sums | {"units": objective.units(y), "samples": len(y)}


def split_metrics(
    sums: dict[str, float], split: str, objective: Objective | None
) -> dict[str, float]:
    """The metrics of ``split`` from its :func:`output_sums` (added up over batches)."""
    objective = objective or Classification()
    metrics = objective.compute(sums)
    out = {f"{split}_{k}": v for k, v in metrics.items()}
    for k in (*objective.tallies, "units", "samples"):
        if k in metrics:  # a sum named as a metric: the metric is what is reported
            continue
        v = sums[k]
        out[f"{split}_{k}"] = int(v) if float(v).is_integer() else v
    return out


# the most samples evaluated in one forward pass: a larger split is summed over batches
EVAL_BATCH = 4096


def evaluate_samples(
    model: nn.Module, samples: Any, split: str = "test", objective: Objective | None = None
) -> dict[str, float]:
    """:func:`evaluate` on a split's samples (:mod:`.samples`), read :func:`eval_batch`
    samples at a time (one pass when it holds no more) and the sums added up: the same
    samples give the same figures however they are batched, up to the float sum's
    rounding."""
    from .samples import evaluate_batches

    objective = objective or Classification()
    n = len(samples)
    if not n:
        total = dict.fromkeys(("loss", *objective.tallies, "units", "samples"), 0)
        return split_metrics(total, split, objective)
    size = eval_batch(model, samples.batch(torch.arange(1))[0])
    if n <= size:
        return evaluate(model, *samples.batch(torch.arange(n)), split, objective)
    total: dict[str, float] = {}
    for x, y in evaluate_batches(samples, size):
        for k, v in _sums(model, x, y, objective).items():
            total[k] = total.get(k, 0) + v
    return split_metrics(total, split, objective)


# the most output values one evaluation forward pass makes (256 MB of float32 logits): a
# language model's output is (samples, tokens, vocabulary), 4096 windows of 256 tokens
# over a 50k vocabulary would be 210 GB
EVAL_OUTPUTS = 2**26


def eval_batch(model: nn.Module, x: Any) -> int:
    """Samples per evaluation forward pass: at most ``EVAL_BATCH``, and at most
    ``EVAL_OUTPUTS`` output values (measured on one sample ``x``)."""
    from .batches import to_device

    first = next(model.parameters(), None)
    if first is not None and first.device.type != "cpu":
        x = to_device(x, first.device)
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            per_sample = max(1, model(x).numel())
    finally:
        model.train(was)
    return max(1, min(EVAL_BATCH, EVAL_OUTPUTS // per_sample))
