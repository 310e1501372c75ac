"""A check shared by the first-run tests: a random graph ran whole, in dependence order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dagtrain.taskgraph import RunReport


def assert_ran_in_order(
    log: list[int], preds: Mapping[int, Iterable[int]], n: int, report: RunReport
) -> None:
    """Tasks 0..n-1 each logged once, all done, every one after its predecessors."""
    assert sorted(log) == list(range(n)) and set(report.states) == {"done"}
    pos = {t: k for k, t in enumerate(log)}
    for i, p in preds.items():
        for j in p:
            assert pos[j] < pos[i], (j, i)
