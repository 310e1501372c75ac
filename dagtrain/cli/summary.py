"""The closing lines of a run, the same for ``dagtrain run`` and ``dagtrain trigger
--wait``: validation and test metrics, each named as such, and one line on promotion.

Their inputs are what the phases returned (their XComs): the training task's summary,
the evaluation's metrics and verdict, and the promotion's registry entry (None when it
did not promote).
"""

from __future__ import annotations

from typing import Any

from dagtrain.phases.verdict import exact, shown

__all__ = ["outcome_lines"]


def outcome_lines(
    train: dict[str, Any] | None, evaluation: dict[str, Any] | None, promoted: dict | None
) -> list[str]:
    lines = []
    if train and train.get("val_accuracy") is not None:
        epochs = len(train.get("epochs") or [])
        lines.append(f"validation accuracy {train['val_accuracy']:.4f} (after {epochs} epoch(s))")
    if not evaluation:
        return lines
    m = evaluation["metrics"]
    lines.append(
        f"test accuracy {m['test_accuracy']:.4f} (test loss {m['test_loss']:.4f}, "
        f"{m['test_samples']} test samples)"
    )
    champ, champ_metrics = evaluation.get("champion"), evaluation.get("champion_metrics")
    if promoted:
        if champ is not None and champ_metrics:
            # as many digits as it takes to show the two apart (a promotion is a change)
            new, old = shown(
                [exact(m, "test_accuracy"), exact(champ_metrics, "test_accuracy")],
                lambda v: v[0] != v[1],
            )
            lines.append(f"promoted v{promoted['version']} ({new}), was v{champ} ({old})")
        else:
            lines.append(
                f"promoted v{promoted['version']} ({m['test_accuracy']:.4f}), the first champion"
            )
    elif evaluation.get("better"):
        lines.append("not promoted: the promote task did not succeed")
    else:
        lines.append(f"not promoted: {evaluation.get('reason')}")
    return lines
