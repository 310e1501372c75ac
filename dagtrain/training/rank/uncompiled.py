"""A rank runs without loading torch's compiler.

torch marks some of its functions "not to be compiled" with ``torch._disable_dynamo``,
which imports ``torch._dynamo`` (about 1.2 s of CPU, as much as torch's own import) the
first time the function is called, only to build its "disabled" version, kept on the
function (``__dynamo_disable``). A rank calls such functions when it builds an optimizer
or takes its state out and in, and a pipeline rank on every op of the forward that
describes its stages' shapes on the meta device (torch's meta kernels and
decompositions, ``torch._refs``). A rank compiles nothing, so :func:`leave_compiler_unloaded`
keeps on each marked function, beforehand, a mark that calls the function as it is while
the compiler is not loaded (nothing can be compiling) and, once anything has loaded it,
builds torch's own, as torch would, and puts it in its place. With the compiler loaded
already (a model factory that compiles), nothing is changed.

The marked functions are found by their code (the ``inner`` of ``_disable_dynamo``),
among the objects the garbage collector tracks: about 30 ms, once, and again only when
modules were imported since. A function torch no longer marks so is not found, and torch
then imports its compiler, as it did.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from typing import Any

COMPILER = "torch._dynamo"
_modules_when_scanned = 0


def compiler_loaded() -> bool:
    return COMPILER in sys.modules


def leave_compiler_unloaded() -> None:
    """Each function torch marks "not to be compiled", its mark made lazy (above)."""
    global _modules_when_scanned
    if compiler_loaded() or len(sys.modules) == _modules_when_scanned:
        return
    import torch._compile

    probe = torch._compile._disable_dynamo(compiler_loaded)
    code = probe.__code__
    for obj in gc.get_objects():
        if type(obj) is type(probe) and obj.__code__ is code and obj is not probe:
            cells = dict(zip(code.co_freevars, obj.__closure__ or (), strict=True))
            if "fn" not in cells or "recursive" not in cells:
                return  # torch's wrapper changed: leave every mark to torch
            fn = cells["fn"].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = _lazy_mark(fn, cells["recursive"].cell_contents)
    _modules_when_scanned = len(sys.modules)


def _lazy_mark(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if not compiler_loaded():
            return fn(*args, **kwargs)
        # (an import, not sys.modules: another thread may be importing it now)
        real = importlib.import_module(COMPILER).disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = real  # torch's own from now on
        return real(*args, **kwargs)

    return call
