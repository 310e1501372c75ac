"""The closing lines of a run, the same for ``dagtrain run`` and ``dagtrain trigger
--wait``: where training started from (a warm start, ``training.init``), a pipeline's
layout and order, validation and test metrics, each named as such, and one line on
promotion.

Their inputs are what the phases returned (their XComs): the training task's summary,
the evaluation's metrics and verdict, and the promotion's registry entry (None when it
did not promote).

The metrics are the objective's (``classification``: accuracy and loss; ``regression``:
mse, mae, r2; ``language_model``: perplexity, accuracy; the author's own): the
validation line shows each but the loss, the test line leads with the metric promotion
compared (``evaluation.metric``, by default the objective's first) and names it where it
is not accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagtrain.config import OBJECTIVE_METRICS
from dagtrain.phases.verdict import exact, shown
from dagtrain.records.result import metric_names

__all__ = [
    "early_stop_lines",
    "init_line",
    "outcome_lines",
    "pipeline_lines",
    "promotion_metric_of",
]


def outcome_lines(
    train: dict[str, Any] | None,
    evaluation: dict[str, Any] | None,
    promoted: dict | None,
    metric: str | None = None,
) -> list[str]:
    """The closing lines; ``metric``: the promotion metric (``PipelineConfig.
    promotion_metric``), where the caller knows it (else :func:`promotion_metric_of`)."""
    lines = []
    said = init_line(train)
    if said:
        lines.append(said)
    lines += pipeline_lines(train)
    names = _names(train, (evaluation or {}).get("metrics"))
    rows = (train or {}).get("epochs") or [{}]
    last = rows[-1]
    lines += early_stop_lines(train)
    kept = ((train or {}).get("early_stop") or {}).get("best_epoch")
    if isinstance(kept, int) and 0 <= kept < len(rows):
        last = rows[kept]  # the model kept is the best epoch's: its figures
    held = [n for n in names if n != "loss"] or names
    val = [(n, last[f"val_{n}"]) for n in held if isinstance(last.get(f"val_{n}"), int | float)]
    if train and not val and train.get("val_accuracy") is not None:
        val = [("accuracy", train["val_accuracy"])]  # a summary without its epoch rows
    if val:
        epochs = len(train.get("epochs") or []) if train else 0
        if isinstance(kept, int):
            epochs = kept + 1
        figures = ", ".join(f"{n} {v:.4f}" for n, v in val)
        lines.append(f"validation {figures} (after {epochs} epoch(s))")
    if not evaluation:
        return lines
    m = evaluation["metrics"]
    metric = metric or evaluation.get("metric") or promotion_metric_of(evaluation, train)
    # the promotion metric first, then the objective's others (the loss last), each test_
    others = [f"test_{n}" for n in names or _BUILTIN_NAMES if f"test_{n}" != metric]
    others = [k for k in others if isinstance(m.get(k), int | float)]
    if "test_loss" in others:  # the loss last, as classification has always shown it
        others = [k for k in others if k != "test_loss"] + ["test_loss"]
    besides = [f"{_said(k)} {m[k]:.4f}" for k in others]
    if m.get("test_samples") is not None:
        besides.append(f"{m['test_samples']} test samples")
    if metric in m:
        also = f" ({', '.join(besides)})" if besides else ""
        lines.append(f"{_said(metric)} {m[metric]:.4f}{also}")
    champ, champ_metrics = evaluation.get("champion"), evaluation.get("champion_metrics")
    # an accuracy goes unnamed, as it always has; any other metric is named
    named = "" if metric == "test_accuracy" else f"{_said(metric)} "
    if promoted and metric in m:
        if champ is not None and champ_metrics and metric in champ_metrics:
            # as many digits as it takes to show the two apart (a promotion is a change)
            new, old = shown(
                [exact(m, metric), exact(champ_metrics, metric)],
                lambda v: v[0] != v[1],
            )
            lines.append(f"promoted v{promoted['version']} ({named}{new}), was v{champ} ({old})")
        elif champ is not None:
            lines.append(f"promoted v{promoted['version']} ({named}{m[metric]:.4f}), over v{champ}")
        else:
            lines.append(
                f"promoted v{promoted['version']} ({named}{m[metric]:.4f}), the first champion"
            )
    elif promoted:
        lines.append(f"promoted v{promoted['version']}: {evaluation.get('reason')}")
    elif evaluation.get("better"):
        lines.append("not promoted: the promote task did not succeed")
    else:
        lines.append(f"not promoted: {evaluation.get('reason')}")
    return lines


def init_line(train: dict[str, Any] | None) -> str | None:
    """The line of a warm start (the training summary's ``init``): ``started from
    champion v3 (training.init: champion)``, ``started from model.pt (training.init:
    a file)``, or, where there was no champion yet, that it trained from scratch; None
    for scratch, as asked (no line: nothing to say)."""
    init = (train or {}).get("init")
    if not isinstance(init, dict):
        return None
    kind = init.get("kind")
    if kind == "champion":
        return f"started from champion v{init.get('version')} (training.init: champion)"
    if kind == "file":
        name = Path(str(init.get("path") or "")).name
        if len(name) > 34:  # the line within 80 columns
            name = name[:31] + "..."
        return f"started from {name} (training.init: a model file)"
    if init.get("note"):
        return "training.init champion: no champion yet, trained from scratch"
    return None


def pipeline_lines(train: dict[str, Any] | None) -> list[str]:
    """A pipeline run's layout and order (the training summary's ``pipeline``), each
    line within 80 columns for a usual run: ``pipeline: 2 stages x 1 replica, 4
    microbatches`` and ``pipeline split [3] (auto), order 1f1b (measured: 1f1b 15.8 ms,
    gpipe 16.9 ms)``, the times the median step of each order that ``order: auto``
    tried; none without a pipeline."""
    p = (train or {}).get("pipeline")
    if not isinstance(p, dict) or not p.get("stages"):
        return []
    d, v = p.get("replicas", 1), p.get("chunks", 1)
    chunks = ""
    if v > 1:
        chunks = f", {v} chunks a rank" + (" in a V" if p.get("placement") == "v" else "")
    layout = (
        f"pipeline: {p['stages']} stages x {d} {'replica' if d == 1 else 'replicas'}, "
        f"{p.get('microbatches')} microbatches{chunks}"
    )
    split = f"pipeline split {p.get('split')}{' (auto)' if p.get('how') == 'auto' else ''}"
    order = f"order {p.get('order')}"
    trial = p.get("order_trial")
    if isinstance(trial, dict) and trial.get("chosen") is None:  # (a run shorter than it)
        order = f"order auto ({p.get('order')}: trial unfinished)"
    elif isinstance(trial, dict) and trial.get("median_step_ms"):
        times = ", ".join(f"{o} {ms:.1f} ms" for o, ms in trial["median_step_ms"].items())
        order += f" (measured: {times})"
    return [layout, f"{split}, {order}"]


def early_stop_lines(train: dict[str, Any] | None) -> list[str]:
    """The lines of early stopping (the training summary's ``early_stop``): where it
    stopped and why, and which epoch's model is kept; none without it."""
    es = (train or {}).get("early_stop")
    if not isinstance(es, dict) or es.get("best_epoch") is None:
        return []
    epochs = len((train or {}).get("epochs") or [])
    metric = _said(str(es.get("metric", "")))
    best, value = es["best_epoch"], es.get("best")
    out = []
    if es.get("stopped_after_epoch") is not None:
        out.append(
            f"stopped early after epoch {es['stopped_after_epoch'] + 1}: {metric} did not "
            f"improve for {es.get('patience')} epoch(s)"
        )
    if out or best != epochs - 1:  # (the last epoch's model, as without early stopping)
        figure = f" ({metric} {value:.4f})" if isinstance(value, int | float) else ""
        out.append(f"kept the best epoch, {best + 1} of {epochs}{figure}")
    return out


# the metrics a test line may show when the training task's summary is not at hand
_BUILTIN_NAMES = list(dict.fromkeys(n for ms in OBJECTIVE_METRICS.values() for n in ms))


def _said(key: str) -> str:
    """``test_mse`` as a line says it: ``test mse``."""
    return key.replace("_", " ")


def _names(train: dict[str, Any] | None, tested: dict[str, Any] | None = None) -> list[str]:
    """The objective's metrics, from the training's last epoch row, else from the
    objective its config names (a built-in's), else the built-in objective with the most
    metrics whose every metric ``tested`` (an evaluation's metrics) holds; none where
    nothing says."""
    epochs = (train or {}).get("epochs") or []
    names = metric_names(epochs[-1]) if epochs and isinstance(epochs[-1], dict) else []
    if names:
        return names
    objective = ((train or {}).get("config") or {}).get("objective")
    name = objective.get("name") if isinstance(objective, dict) else objective
    known = OBJECTIVE_METRICS.get(str(name or ""))
    if known is None and tested:
        fits = [ms for ms in OBJECTIVE_METRICS.values() if all(f"test_{n}" in tested for n in ms)]
        known = max(fits, key=len, default=None)
    known = known or {}
    return [n for n in known if n != "loss"] + (["loss"] if "loss" in known else [])


def promotion_metric_of(evaluation: dict[str, Any], train: dict[str, Any] | None = None) -> str:
    """The metric promotion compared, told from what the phases returned: the one the
    evaluation's ``reason`` names (``test perplexity 5.2100 beats ...``; the verdict
    names it in every reason but a first model's), else the objective's first (from the
    training's summary, else the built-in whose metrics the evaluation holds), else
    ``test_accuracy`` where the evaluation has it, else ``test_loss``
    (``PipelineConfig.promotion_metric``'s rule). A first model's reason names no
    metric: where ``evaluation.metric`` is not the objective's first, only the caller's
    config knows it (``outcome_lines``'s ``metric``)."""
    m = evaluation.get("metrics") or {}
    reason = str(evaluation.get("reason") or "")
    said = [
        k
        for k in m
        if k.startswith("test_")
        and (reason.startswith(f"{_said(k)} ") or f" has no {_said(k)}:" in reason)
    ]
    if said:
        return max(said, key=len)  # test mae, not test ma (an author's names may nest)
    first = next(iter(_names(train, m)), None)
    if first is not None and f"test_{first}" in m:
        return f"test_{first}"
    return "test_accuracy" if "test_accuracy" in m else "test_loss"
