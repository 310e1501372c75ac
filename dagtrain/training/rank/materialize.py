"""Building one pipeline stage of a model, each of its tensors as a whole build makes it.

A pipeline rank holds only its stage's blocks, so it must not build the whole model;
yet each parameter and buffer it owns must hold, bit for bit, what a whole build on the
CPU from the same seed gives it, so that pipelined runs stay comparable with whole-model
ones. A model factory is arbitrary Python: how much of the CPU generator's stream each
tensor's initialisation draws cannot be predicted, only replayed.

So the factory runs twice. :func:`describe` builds it on the meta device (no memory,
no draws) under a :class:`~torch.overrides.TorchFunctionMode` that records, in order,
each call returning a tensor on a new storage (a *creation*: a factory, a ``clone``, a
temporary) and which creation each parameter and buffer FQN is. :func:`materialize`
builds it again for real (the caller seeds as for a whole build) and hands each creation
that only non-owned tensors are memory at the start of one scratch buffer (as large as
the largest of them): their in-place initialisations run on real memory and draw what
they draw in a whole build, while what is held is the owned tensors plus that buffer
(plus, for a creation that is not a plain factory, its result while it is copied in).
Owned tensors and temporaries (whose values may flow into owned ones) are real. Then
every non-owned parameter and buffer becomes a meta tensor of its shape.

It refuses (RuntimeError) rather than get a value wrong: a second build whose creations
differ from the first's (a nondeterministic factory), or one that reads a non-owned
tensor's values after its scratch was reused (copying one layer's weights into
another). A tensor shared by an owned and a non-owned FQN (tied weights) stays real
under both names: :meth:`Description.ties` lists such pairs, :func:`materialize` logs
them. A factory that cannot run on the meta device (it reads a value: ``.item()``, or
``nn.init.trunc_normal_``'s rejection loop) fails in :func:`describe`: build it whole.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["Creation", "Description", "describe", "materialize", "owned_names"]

log = logging.getLogger(__name__)

Owned = set[str] | frozenset[str] | Callable[[str], bool]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# calls that read only a tensor's metadata, or make a view: harmless on reused scratch
_METADATA = _names(
    "__get__ size dim numel stride storage_offset element_size nelement ndimension "
    "is_floating_point is_complex is_contiguous untyped_storage data_ptr get_device "
    "requires_grad_ detach view view_as __getitem__ t transpose permute squeeze "
    "unsqueeze flatten unflatten expand narrow select as_strided __len__ __hash__"
)
_LIKE = _names(  # they read only their first argument's metadata
    "empty_like zeros_like ones_like full_like randn_like rand_like randint_like new_empty "
    "new_empty_strided new_zeros new_ones new_full new_tensor"
)
_OVERWRITE = _names(  # in-place calls that set every element of their first argument
    "uniform_ normal_ fill_ zero_ copy_ random_ bernoulli_ exponential_ geometric_ "
    "log_normal_ cauchy_ kaiming_uniform_ kaiming_normal_ constant_ ones_ zeros_ eye_ "
    "dirac_"
)
# factories a scratch creation is made by in the scratch itself (others: copied in)
_EMPTY = {torch.empty, torch.empty_like, torch.empty_strided, Tensor.new_empty}
_FILL = {torch.zeros_like: 0, torch.ones_like: 1, Tensor.new_zeros: 0, Tensor.new_ones: 1}
_OUT = {torch.zeros, torch.ones, torch.full, torch.randn, torch.rand, torch.randint}
_OUT |= {torch.normal, torch.arange, torch.eye, torch.linspace}
_NOT_WITH_OUT = ("dtype", "device", "layout", "pin_memory", "requires_grad", "memory_format")
_IS_META = Tensor.is_meta.__get__  # type: ignore[attr-defined]


def _key(t: Tensor) -> int:
    """The identity of ``t``'s storage (shared by its views and its ``nn.Parameter``)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested: no storage
        return id(t)


def _name(func: Any) -> str:
    return getattr(func, "__name__", repr(func))


@dataclass(frozen=True)
class Creation:
    """A call of a build that returned a tensor on a new storage: the call's name and
    the tensor's shape, strides and dtype."""

    call: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, call: str, t: Tensor) -> Creation:
        return cls(call, tuple(t.shape), tuple(t.stride()), t.dtype)

    @property
    def nbytes(self) -> int:
        """The bytes its shape and strides span."""
        if 0 in self.shape:
            return 0
        return (1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))) * self.dtype.itemsize


@dataclass
class Description:
    """A build on the meta device: the model, its creations in order, and which creation
    each parameter and buffer (by FQN) is; those the build did not create are absent."""

    model: nn.Module
    creations: list[Creation]
    index: dict[str, int]

    def scratch(self, owned: Owned) -> set[int]:
        """The creations that only non-owned parameters and buffers are."""
        is_owned, names = _predicate(owned), {}
        for fqn, i in self.index.items():
            names[i] = names.get(i, False) or is_owned(fqn)
        return {i for i, any_owned in names.items() if not any_owned}

    def scratch_bytes(self, owned: Owned) -> int:
        """The size of the scratch buffer :func:`materialize` uses for ``owned``."""
        return max((self.creations[i].nbytes for i in self.scratch(owned)), default=0)

    def ties(self, owned: Owned) -> list[tuple[str, str]]:
        """(owned, non-owned) FQNs of one tensor (or storage): both stay real."""
        return _ties(self.model, _predicate(owned))


def _predicate(owned: Owned) -> Callable[[str], bool]:
    return owned if callable(owned) else frozenset(owned).__contains__


def _tensors(model: nn.Module) -> Iterable[tuple[str, Tensor]]:
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _ties(model: nn.Module, is_owned: Callable[[str], bool]) -> list[tuple[str, str]]:
    groups: dict[int, list[str]] = {}
    for fqn, t in _tensors(model):
        groups.setdefault(_key(t), []).append(fqn)
    return [(a, b) for g in groups.values() for a in g if is_owned(a) for b in g if not is_owned(b)]


class _Recorder(TorchFunctionMode):
    """Records each creation: a call whose result has a tensor on a storage none of
    its inputs has."""

    def __init__(self) -> None:
        super().__init__()
        self.creations: list[Creation] = []
        self.keep: list[Tensor] = []  # kept alive, so no storage's identity is reused

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        out = self.substitute(func, args, kwargs, inputs)
        if out is not None:
            return out
        out = func(*args, **kwargs)
        new = [t for t in tree_leaves(out) if isinstance(t, Tensor) and _key(t) not in inputs]
        for t in new:
            replaced = self.made(func, t)
            if replaced is not None and len(new) == 1 and out is t:
                out = replaced
        return out

    def substitute(self, func: Any, args: tuple, kwargs: dict, inputs: set[int]) -> Any:
        # on meta, nn.init.orthogonal_ and sparse_ return at once, making fewer tensors
        # than on the CPU: the description follows the CPU's path
        return False if func == _IS_META else None

    def made(self, func: Any, t: Tensor) -> Tensor | None:
        self.creations.append(Creation.of(_name(func), t))
        self.keep.append(t)
        return None


def describe(build: Callable[[], nn.Module]) -> Description:
    """``build()`` on the meta device, its creations recorded (the CPU generator's
    state kept). Whatever the factory raises on the meta device, it raises."""
    recorder = _Recorder()
    with torch.random.fork_rng(devices=[]), torch.device("meta"), recorder:
        model = build()
    created = {_key(t): i for i, t in enumerate(recorder.keep)}
    index = {fqn: created[_key(t)] for fqn, t in _tensors(model) if _key(t) in created}
    return Description(model, recorder.creations, index)


def owned_names(model: nn.Module, modules: Iterable[nn.Module]) -> set[str]:
    """The FQNs in ``model`` of the parameters and buffers of ``modules`` (its
    submodules, or modules sharing its tensors such as :func:`~.split.blocks_of`'s);
    a tensor's every FQN, so a tie within ``model`` is owned under all its names."""
    mine = {id(t) for m in modules for _, t in _tensors(m)}
    return {fqn for fqn, t in _tensors(model) if id(t) in mine}


class _Replay(_Recorder):
    """The real build, each creation checked against the description's; a scratch one
    is handed the start of ``buffer`` (made there by a plain factory, else copied in)."""

    def __init__(self, description: Description, scratch: set[int], size: int) -> None:
        super().__init__()
        self.description, self.scratch = description, scratch
        self.buffer = mmap.mmap(-1, size) if size else None
        self.handouts: dict[int, tuple[int, int]] = {}  # storage: (creation, numel)
        self.live: int | None = None  # the handout whose values the buffer holds

    def substitute(self, func: Any, args: tuple, kwargs: dict, inputs: set[int]) -> Any:
        self._guard(func, args, kwargs, inputs & self.handouts.keys())
        i = len(self.creations)
        if i not in self.scratch or "out" in kwargs or not self.description.creations[i].nbytes:
            return None
        if func not in _EMPTY and func not in _FILL and func not in _OUT:
            return None
        probe = func(*args, **{**kwargs, "device": "meta"})  # draws nothing
        self._check(i, Creation.of(_name(func), probe))
        t = self._handout(i, probe.requires_grad)
        with torch.no_grad():
            if func in _OUT:  # the same kernel on the same shape: the same draws
                func(*args, out=t, **{k: v for k, v in kwargs.items() if k not in _NOT_WITH_OUT})
            elif func in _FILL:
                t.fill_(_FILL[func])
        return t

    def made(self, func: Any, t: Tensor) -> Tensor | None:
        i = len(self.creations)
        self._check(i, Creation.of(_name(func), t))
        if i not in self.scratch or not t.numel():
            return None  # real, and not kept: a temporary is freed when the build drops it
        h = self._handout(i, t.requires_grad)
        with torch.no_grad():
            h.copy_(t)
        return h

    def _check(self, i: int, got: Creation) -> None:
        want = self.description.creations
        if i >= len(want) or got != want[i]:
            was = f"#{i} was {want[i]}" if i < len(want) else f"s were {len(want)}"
            _nondeterministic(f"made {got} where the first build's creation{was}")
        self.creations.append(got)

    def _handout(self, i: int, requires_grad: bool) -> Tensor:
        c = self.description.creations[i]
        flat = torch.frombuffer(self.buffer, dtype=c.dtype, count=c.nbytes // c.dtype.itemsize)
        t = torch.empty(0, dtype=c.dtype).set_(flat.untyped_storage(), 0, c.shape, c.stride)
        self.handouts[_key(t)] = (i, t.numel())
        self.keep.append(t)  # its own storage object: who reads which handout is known
        self.live = _key(t)
        return t.requires_grad_(requires_grad)

    def _guard(self, func: Any, args: tuple, kwargs: dict, touched: set[int]) -> None:
        """Refuses a call that reads a handout whose memory another has written since;
        a call that sets every element of a handout makes it the live one."""
        name = _name(func)
        if not touched or name in _METADATA:
            return
        target = args[0] if args else kwargs.get("tensor")  # nn.init passes tensor=
        target = target if isinstance(target, Tensor) else None
        if name in _LIKE and target is not None:
            touched = touched - {_key(target)}
        key = _key(target) if target is not None else None
        whole = key in touched and name in _OVERWRITE
        becomes = key if whole and target.numel() == self.handouts[key][1] else None
        stale = touched - {becomes, self.live}
        if stale:
            i = self.handouts[stale.pop()][0]
            fqn = min((f for f, j in self.description.index.items() if j == i), default="?")
            raise RuntimeError(
                f"materialize: the model factory reads {fqn} (creation #{i}, "
                f"{self.description.creations[i]}) in {name}() after its memory was reused "
                "for another tensor this stage does not own: this model cannot be built "
                "one stage at a time; own that tensor too, or build the whole model"
            )
        if becomes is not None:
            self.live = becomes


def _nondeterministic(what: str) -> None:
    raise RuntimeError(
        f"materialize: the model factory is not deterministic: building it again {what}; "
        "a stage cannot be built apart from the whole model"
    )


def materialize(
    build: Callable[[], nn.Module], owned: Owned, description: Description | None = None
) -> nn.Module:
    """``build()`` on the CPU with the ``owned`` parameters and buffers (FQNs, or a
    predicate on them) real, each equal to its value in a whole build, and the others
    on the meta device; the CPU generator ends where a whole build leaves it. Seed it
    first exactly as for a whole build. ``description``: ``describe(build)``, if made.
    A tensor both owned and not (tied) stays real under both names, and is logged."""
    description = description or describe(build)
    is_owned = _predicate(owned)
    scratch, size = description.scratch(is_owned), description.scratch_bytes(is_owned)
    replay = _Replay(description, scratch, size)
    with replay:
        model = build()
    if len(replay.creations) != len(description.creations):
        _nondeterministic(f"made {len(replay.creations)} tensors, not {len(description.creations)}")
    real: dict[int, bool] = {}
    for fqn, t in _tensors(model):
        real[_key(t)] = real.get(_key(t), False) or is_owned(fqn)
    for a, b in _ties(model, is_owned):
        log.warning("materialize: %s (owned) and %s (not owned) are one tensor: kept real", a, b)
    metas: dict[int, Tensor] = {}
    for module in model.modules():
        for table, param in ((module._parameters, True), (module._buffers, False)):
            for name, t in table.items():
                if t is None or real[_key(t)]:
                    continue
                if id(t) not in metas:
                    meta = torch.empty_like(t, device="meta")
                    metas[id(t)] = nn.Parameter(meta, t.requires_grad) if param else meta
                table[name] = metas[id(t)]
    return model
