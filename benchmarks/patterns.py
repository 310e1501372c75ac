"""Task-Bench dependence patterns (Slaughter et al., SC'20), as plain programs.

A program is a list of ``(key, deps)`` in program order: ``key = (step, point)``, and
``deps`` the keys of the previous step it reads. Every benchmark builds its graph
from the same program, so each runtime executes the same work in the same order.
"""

from __future__ import annotations

import random

__all__ = ["PATTERNS", "program"]


def _stencil(t: int, i: int, w: int) -> list[int]:
    return [j for j in (i - 1, i, i + 1) if 0 <= j < w]


def _fft(t: int, i: int, w: int) -> list[int]:
    span = 1 << ((t - 1) % max(1, (w - 1).bit_length()))
    return sorted({i, i ^ span} & set(range(w)))


def _tree(t: int, i: int, w: int) -> list[int]:
    return [i // 2]


def _nearest(rng: random.Random):
    def deps(t: int, i: int, w: int) -> list[int]:
        near = [j for j in range(i - 2, i + 3) if 0 <= j < w]
        return sorted(rng.sample(near, k=min(3, len(near))))

    return deps


PATTERNS = {
    "trivial": lambda t, i, w: [],
    "chains": lambda t, i, w: [i],
    "stencil": _stencil,
    "tree": _tree,
    "fft": _fft,
    "nearest": None,  # made per program, seeded
}


def program(pattern: str, width: int, steps: int, seed: int = 0) -> list[tuple[tuple, list]]:
    deps_of = PATTERNS[pattern] or _nearest(random.Random(seed))
    prog = []
    for t in range(steps):
        w = min(1 << t, width) if pattern == "tree" else width
        for i in range(w):
            prog.append(((t, i), [(t - 1, j) for j in deps_of(t, i, width)] if t else []))
    return prog
