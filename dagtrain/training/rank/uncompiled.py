"""A rank runs without loading torch's compiler.

torch marks some of its functions "not to be compiled" with ``torch._disable_dynamo``,
which imports ``torch._dynamo`` (about 1.2 s of CPU, as much as torch's own import) the
first time the function is called, only to build its "disabled" version, kept on the
function (``__dynamo_disable``). A rank calls such functions when it builds an optimizer
or takes its state out and in, and a pipeline rank on many ops of the forward that
describes its stages' shapes on the meta device (those whose meta kernel is one of
torch's Python references or decompositions, ``torch._refs``). A rank compiles nothing,
so :func:`leave_compiler_unloaded` keeps on each marked function, beforehand, a mark
that calls the function as it is while the compiler is not loaded (nothing can be
compiling) and, should something load it meanwhile, builds torch's own, as torch does,
and puts it in its place.

Once the compiler is loaded (a model factory that calls ``torch.compile``), the next
call removes every such mark still in place: torch builds its own at each function's
next call, in its own frame, which its compiler skips (our mark's frame it would try to
compile). The rank calls it as it starts and again as it builds its optimizer, after
the model's factory ran.

The marked functions are found by their code (the ``inner`` of ``_disable_dynamo``),
among the objects the garbage collector tracks: a walk of the heap, 30-60 ms, again
only when modules were imported since. A function torch no longer marks so is not
found, and torch then imports its compiler, as it did; so is a function marked after
the last walk.
"""

from __future__ import annotations

import gc
import importlib
import sys
import weakref
from collections.abc import Callable
from typing import Any

COMPILER = "torch._dynamo"
_modules_when_scanned = 0
_ours: weakref.WeakSet = weakref.WeakSet()  # the functions that carry one of our marks


def compiler_loaded() -> bool:
    return COMPILER in sys.modules


def leave_compiler_unloaded() -> None:
    """Each function torch marks "not to be compiled", its mark made lazy (above); with
    the compiler loaded, torch's own again."""
    global _modules_when_scanned
    if compiler_loaded():
        _torchs_own_again()
        return
    if len(sys.modules) == _modules_when_scanned:
        return
    _modules_when_scanned = len(sys.modules)
    import torch._compile

    probe = torch._compile._disable_dynamo(compiler_loaded)
    code = probe.__code__
    if not {"fn", "recursive"} <= set(code.co_freevars):
        return  # torch's wrapper changed: every mark is left to torch
    fn_at, recursive_at = code.co_freevars.index("fn"), code.co_freevars.index("recursive")
    for obj in gc.get_objects():
        if type(obj) is not type(probe) or obj.__code__ is not code or obj is probe:
            continue
        cells = obj.__closure__ or ()
        fn = cells[fn_at].cell_contents
        if getattr(fn, "__dynamo_disable", None) is not None:
            continue  # called already: torch's own
        try:
            fn.__dynamo_disable = _lazy_mark(fn, cells[recursive_at].cell_contents)
        except (AttributeError, TypeError):  # takes no attributes: left to torch
            continue
        _ours.add(fn)


def _lazy_mark(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if not compiler_loaded():
            return fn(*args, **kwargs)
        # (an import, not sys.modules: another thread may be importing it now)
        real = importlib.import_module(COMPILER).disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = real  # torch's own from now on
        return real(*args, **kwargs)

    call.lazy = True
    return call


def _torchs_own_again() -> None:
    """Every mark of ours still in place removed: torch builds its own at the next call."""
    for fn in list(_ours):
        if getattr(getattr(fn, "__dynamo_disable", None), "lazy", False):
            del fn.__dynamo_disable
    _ours.clear()
