"""An elastic run's world change as people read it: one line, the same in the task's
log, ``dagtrain run``'s output and the run summary. Standard library only (the CLI
imports it without torch)."""

from __future__ import annotations

from typing import Any

__all__ = ["change_line", "change_parts"]


def change_line(change: dict[str, Any]) -> str:
    """``world 3 -> 2 ranks at step 557: rank 1 on host c was killed by SIGKILL
    (recovered in 5.3 s, 1 step lost)`` for a world change record (see
    ``dagtrain.training.driver.elastic``); ``world of 3 ranks relaunched at step 557: ...``
    for a relaunch on the same slots."""
    what, figures = change_parts(change)
    return f"{what} ({figures})" if figures else what


def change_parts(change: dict[str, Any]) -> tuple[str, str]:
    """The two parts of :func:`change_line`: what changed and why, and the figures
    (``recovered in 5.3 s, 1 step lost``; empty when there are none)."""
    step = change.get("step")
    if change.get("change") == "restart":  # the same slots, new processes
        head = f"world of {change.get('to')} ranks relaunched"
    else:
        head = f"world {change.get('from')} -> {change.get('to')} ranks"
    head += f" at step {step}" if step is not None else ""
    parts = []
    if change.get("seconds") is not None:
        parts.append(f"recovered in {float(change['seconds']):.1f} s")
    lost = change.get("steps_lost")
    if lost is not None and change.get("change") != "grow":
        parts.append(f"{lost} step{'' if lost == 1 else 's'} lost")
    return f"{head}: {change.get('why') or 'changed'}", ", ".join(parts)
