"""What ``dagtrain run`` shows while a run goes on, from what Airflow and the ranks report.

Two sources, both JSON lines appended by the processes that know:

- the plugin's task-instance listener (``dagtrain.plugins.listener``), called by
  Airflow in each task's process: a task started, succeeded, was skipped, failed (and
  whether Airflow will try it again);
- rank 0 of each training task (``TrainConfig.metrics_file``): the run started (or
  resumed from a step), an epoch ended (its metrics, samples/s), the run ended.

Nothing here reads Airflow's tables or its log text. ``Display.poll()`` reads what is
new and turns it into lines (each task as it starts and ends, with its duration; each
epoch with its loss, the objective's validation metrics, the LR (and, with clipping,
the gradient norm), samples/s and ETA; a retry as such), printed as plain lines — in a
terminal, above a live table of the tasks (``table()``); piped, with no ANSI codes at all.
"""

from __future__ import annotations

import heapq
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from dagtrain.changes import change_line, change_parts
from dagtrain.records.metrics import Tries, TryEvent
from dagtrain.records.result import metric_names

__all__ = ["Display", "TaskProgress", "dag_order", "label_of"]

COLOUR = {
    "success": "green",
    "failed": "red",
    "running": "yellow",
    "retrying": "magenta",
    "skipped": "dim",
}
_FINAL = ("success", "failed", "skipped", "upstream_failed", "removed")


@dataclass
class TaskProgress:
    label: str
    state: str = "waiting"
    try_number: int = 0
    started: float | None = None
    seconds: float | None = None
    error: str | None = None


def dag_order(downstream: dict[str, Iterable[str]], tie: Callable[[str], Any] = str) -> list[str]:
    """The task ids of ``downstream`` (task id -> its downstream ids), upstream first; of
    tasks ready together, the least by ``tie`` first (default: the id)."""
    nodes = {t: {d for d in downs if d in downstream} for t, downs in downstream.items()}
    indegree = dict.fromkeys(nodes, 0)
    for downs in nodes.values():
        for d in downs:
            indegree[d] += 1
    ready = [(tie(t), t) for t, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, tid = heapq.heappop(ready)
        order.append(tid)
        for d in nodes[tid]:
            indegree[d] -= 1
            if indegree[d] == 0:
                heapq.heappush(ready, (tie(d), d))
    return order


def label_of(path: str | Path) -> str:
    """The training task a metrics file belongs to: ``train``, or a round's shard
    (``rounds/round-01/shard-00/metrics.jsonl``: ``round_1_train[0]``)."""
    from dagtrain.records.layout import RunLayout

    task, index = RunLayout.task_of(path)
    return task if index < 0 else f"{task}[{index}]"


@dataclass
class _Tail:
    """New complete lines of a growing file, from where the last read stopped."""

    path: Path
    offset: int = 0

    def lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for next time
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out


def _headline(error: str | None) -> str | None:
    """An error's first line: what a failed rank last printed (its log's tail, per-epoch
    dicts and all) is for the task's log, which the summary names."""
    if not error:
        return error
    first, _, rest = error.strip().partition("\n")
    return f"{first} (more in the task's log)" if rest.strip() else first


# the metrics' names in an epoch line made short to fit a terminal's width
_SHORT = {"accuracy": "acc", "perplexity": "ppl"}


def _figure(value: Any) -> str:
    """A metric as an epoch line shows it: four decimals (``0.9667``), two from 100 up
    (a regression's absolute error, ``103.12``), one from 1000 (its squared error,
    ``3120.4``); ``inf``, ``nan`` as such."""
    v = float(value)
    size = abs(v) if math.isfinite(v) else 0.0
    return f"{v:.{1 if size >= 1000 else 2 if size >= 100 else 4}f}"


def _lr(value: Any) -> str:
    """An LR as an epoch line shows it: two significant figures in a compact exponent
    (``3.2e-3``, ``1.0e-1``); ``0`` (a schedule decayed to nothing) as such."""
    v = float(value)
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    mantissa, _, exp = f"{v:.1e}".partition("e")
    return f"{mantissa}e{int(exp)}"


def _norm(value: Any) -> str:
    """A gradient norm: three significant figures (``0.784``, ``12.3``), whole from 1000."""
    v = float(value)
    # "#": the trailing zeros kept, as the figures beside it show them (0.500, not 0.5)
    return f"{v:.0f}" if math.isfinite(v) and abs(v) >= 1000 else f"{v:#.3g}".rstrip(".")


def _share(value: Any) -> str:
    """A share in whole percent, never rounded to none or all where it is not
    (``<1%``, ``>99%``)."""
    v = float(value)
    return "<1%" if 0 < v < 0.005 else ">99%" if 0.995 <= v < 1 else f"{v:.0%}"


def _recipe_parts(m: dict[str, Any], level: int) -> list[str]:
    """The training recipe's figures of an epoch row: ``lr 3.2e-3`` (the LR of its last
    step), then with ``training.max_grad_norm`` ``gnorm 0.784`` (the mean norm before
    clipping) and ``(12% clipped)`` (its steps' share clipped). ``level``: 2 all of it,
    1 without the clipped share, 0 the LR alone."""
    out = [f"lr {_lr(m['lr'])}"] if isinstance(m.get("lr"), (int, float)) else []
    if level >= 1 and isinstance(m.get("grad_norm"), (int, float)):
        clip = m.get("clip_rate") if level >= 2 else None
        said = f" ({_share(clip)} clipped)" if isinstance(clip, (int, float)) else ""
        out.append(f"gnorm {_norm(m['grad_norm'])}{said}")
    return out


def _held_parts(held: list[tuple[str, str, str]], short: bool, every: bool) -> list[str]:
    """``val accuracy 0.9``, ``val mse 31.2``, ...: each (split, metric, value) of
    ``held``; ``short``: each name shortened (``acc``) and the split said once per split
    (``val mse 31.2, mae 4.1``); not ``every``: the first metric of each split only."""
    out: list[str] = []
    said = ""
    for split, name, value in held:
        if not every and split == said:
            continue
        if short:
            name = _SHORT.get(name, name)
            out.append(f"{name} {value}" if split == said else f"{split} {name} {value}")
        else:
            out.append(f"{split} {name} {value}")
        said = split
    return out


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Display:
    """A run's tasks and epochs, followed from the listener's events file and the
    training tasks' metrics files under the run's artifact folder."""

    def __init__(
        self,
        console: Console,
        title: str,
        events: Path | None,
        run_dir: Path | None,
        task_ids: list[str],
    ) -> None:
        self.console = console
        self.title = title
        self.events = _Tail(events) if events is not None else None
        self.run_dir = run_dir
        self.metrics: dict[Path, _Tail] = {}
        self.info: dict[str, dict[str, Any]] = {}  # per training task: its start line
        self.tries: dict[str, Tries] = {}  # per training task: its lines' tries so far
        self.tasks: dict[str, TaskProgress] = {t: TaskProgress(t) for t in task_ids}
        # poll() runs in a thread of its own, table() in the live display's: the lock
        # guards the tasks; lines are printed after it is released (printing takes the
        # console's lock, under which the live display calls table())
        self.lock = threading.Lock()
        self.pending: list[tuple[str, str | None]] = []
        self.stopping = False  # set when the run is being stopped (Ctrl-C)

    # ------------------------------------------------------------------ reading
    def poll(self) -> None:
        """Read what is new in the files (the listener's events, the metrics files under
        the run's folder), then print its lines."""
        with self.lock:
            events = list(self.events.lines()) if self.events is not None else []
            metrics = []
            for path in self._metric_files():
                tail = self.metrics.setdefault(path, _Tail(path))
                metrics += [(label_of(path), m) for m in tail.lines()]
        self.feed(events, metrics)  # in the order they happened, as feed() has them

    def feed(self, events: list[dict[str, Any]], metrics: list[tuple[str, dict]]) -> None:
        """What another source read (``dagtrain trigger --wait``: the REST API): events
        as the listener writes them, and (training task label, metrics line) pairs;
        then print their lines."""
        both = [(float(e.get("time") or 0), 0, e, None) for e in events]
        both += [(float(m.get("time") or 0), 1, m, label) for label, m in metrics]
        with self.lock:  # in the order they happened: a task's epochs before its end
            for _, _, item, label in sorted(both, key=lambda x: (x[0], x[1])):
                if label is None:
                    self._event(item)
                else:
                    self._metric(label, item)
        self.flush()

    def flush(self) -> None:
        with self.lock:
            lines, self.pending = self.pending, []
        # in a terminal a long line wraps between words (the terminal would cut a word);
        # piped, a line stays whole
        wrap = not self.console.is_terminal
        for line, style in lines:
            self.console.print(line, style=style, highlight=False, markup=False, soft_wrap=wrap)

    def _metric_files(self) -> list[Path]:
        if self.run_dir is None:
            return []
        from dagtrain.records.layout import RunLayout

        files = [t.metrics for t in RunLayout(self.run_dir).training_folders()]
        return [f for f in files if f.exists()]

    def _task(self, label: str) -> TaskProgress:
        return self.tasks.setdefault(label, TaskProgress(label))

    def _event(self, e: dict[str, Any]) -> None:
        index = e.get("map_index", -1)
        label = e["task_id"] if index is None or index < 0 else f"{e['task_id']}[{index}]"
        st = self._task(label)
        n = int(e.get("try_number") or 1)
        kind, now = e.get("event"), float(e.get("time") or time.time())
        if st.state == "failed" and st.try_number == n:
            # this try was failed by Airflow (the run was stopped, or marked failed): what
            # its task runner reports later, as it is terminated, does not change that
            return
        if kind == "running":
            st.state, st.try_number, st.started, st.seconds = "running", n, now, None
            self.say(f"{label} started" + (f" (try {n})" if n > 1 else ""))
        elif kind in ("success", "skipped"):
            st.state = kind
            st.seconds = now - st.started if st.started else None
            took = f" in {_duration(st.seconds)}" if st.seconds is not None else ""
            self.say(f"{label} {'succeeded' if kind == 'success' else 'skipped'}{took}")
        elif kind == "failed":
            retry = e.get("state") == "up_for_retry"
            st.state = "retrying" if retry else "failed"
            st.try_number = st.try_number or n
            st.seconds = now - st.started if st.started else None
            st.error = _headline(e.get("error"))
            if self.stopping and not retry:
                self.say(f"{label} try {n} stopped: the run is marked failed", "red")
                return
            what = "failed, Airflow will retry it" if retry else "failed"
            self.say(f"{label} try {n} {what}: {st.error or 'no error given'}", "red")

    def _metric(self, label: str, m: dict[str, Any]) -> None:
        info = self.info.setdefault(label, {})
        # what the line means for the tries: the one rule, fed each line as it comes
        got = self.tries.setdefault(label, Tries()).feed(m)
        event = None if got is None else got.what
        if got is not None and event in (TryEvent.START, TryEvent.RELAUNCH):
            info.update(m)  # the current world's start: its first step, for the ETA
            # only a try's first start line says where it began; an elastic run's later
            # ones are relaunches, told as world changes: not resumes
            resumed = got.resumed_from_step
            if event == TryEvent.START and resumed is not None:
                n = self._task(label).try_number or 1
                done = resumed if got.epochs_done_before is None else got.epochs_done_before
                self.say(
                    f"{label} try {n}: resumed from step {resumed} "
                    f"({done} epoch(s) already trained)"
                )
        elif event == TryEvent.WORLD:  # an elastic run lost ranks, or took a host back
            width = self.console.width if self.console.is_terminal else None
            line = f"{label} {change_line(m)}"
            if width is not None and len(line) >= width:  # its figures on a line of their own
                what, figures = change_parts(m)
                self.say(f"{label} {what}", "yellow")
                line = f"{' ' * len(label)}   {figures}" if figures else ""
            if line:
                self.say(line, "yellow")
        elif m.get("kind") == "epoch" and not self.stopping:  # a stopped run's last epochs
            width = self.console.width if self.console.is_terminal else None
            self.say(self._epoch_line(label, info, m, width))

    @staticmethod
    def _epoch_line(
        label: str, info: dict[str, Any], m: dict[str, Any], width: int | None = None
    ) -> str:
        """``train epoch 3/8: loss 0.1, val accuracy 0.9, lr 3.2e-3, 6322 samples/s, ETA
        1.4 s``: the training loss, then each of the objective's metrics on the
        validation (or test) split but its loss, in the objective's order (``val mse
        31.2, val mae 4.1, val r2 0.52``; :func:`metric_names`), then the LR of the
        epoch's last step and, with gradient clipping, the mean gradient norm and the
        share of steps clipped (``gnorm 0.784 (12% clipped)``). In a terminal of
        ``width`` columns, shortened to fit where it must (``val acc``, ``val mse 31.2,
        mae 4.1``; then without the clipped share; then without samples/s; then the
        first metric only; then without the gradient norm; then without the ETA; the LR
        stays), so that the terminal never cuts it mid-word."""
        per = max(int(info.get("steps_per_epoch") or m.get("steps_per_epoch") or 1), 1)
        total = int(m.get("total_steps") or 0)
        epochs = math.ceil(total / per) if total else "?"
        head = f"{label} epoch {int(m.get('epoch', 0)) + 1}/{epochs}: "
        loss = [f"loss {_figure(m['train_loss'])}"] if "train_loss" in m else []
        names = metric_names(m)
        shown = [n for n in names if n != "loss"] or names  # the loss alone: shown as such
        held = [  # (split, metric, value) of each split the row has
            (split, n, _figure(m[f"{split}_{n}"]))
            for split in ("val", "test")
            for n in shown
            if f"{split}_{n}" in m
        ]
        rate = []
        if m.get("samples_per_second"):
            r = float(m["samples_per_second"])
            rate = [f"{r / 1000:.1f}k samples/s" if r >= 10_000 else f"{r:.0f} samples/s"]
        eta = []
        step, first = int(m.get("step") or 0), int(info.get("step") or 0)
        elapsed = float(m.get("elapsed") or 0)
        if total and step > first and elapsed > 0:
            eta = [f"ETA {_duration(elapsed / (step - first) * (total - step))}"]
        line = ""
        # (short names, samples/s, every metric, recipe level): each form narrower
        forms = [(False, True, True, 2), (True, True, True, 2), (True, True, True, 1)]
        forms += [(True, False, True, 1)]
        forms += [(True, False, False, 1)] if len(shown) > 1 else []  # the first metric only
        forms += [(True, False, False, 0)]  # the LR alone
        for short, keep_rate, every, level in forms:
            parts = [*loss, *_held_parts(held, short, every), *_recipe_parts(m, level)]
            line = head + ", ".join([*parts, *(rate if keep_rate else []), *eta])
            if width is None or len(line) < width:
                break
        else:  # still too wide: the ETA goes too
            line = head + ", ".join([*loss, *_held_parts(held, True, False), *_recipe_parts(m, 0)])
        return line

    def settle(self, states: dict[str, tuple[str, int]]) -> None:
        """Each task takes the state Airflow ended it in, where it ended (``states``:
        label -> (state, try number)): skipped, say, when a run was stopped before it, or
        failed where its task runner said it had succeeded after the run was stopped."""
        with self.lock:
            for label, (state, try_number) in states.items():
                st = self._task(label)
                if state in _FINAL:
                    st.state, st.try_number = state, try_number or st.try_number

    # ------------------------------------------------------------------ showing
    def say(self, line: str, style: str | None = None) -> None:
        self.pending.append((line, style))

    def table(self) -> Group:
        """The title (one line, never wrapped: the live display's height stays what it
        measured) above a table of the tasks; the newest epoch line is right above."""
        t = Table()
        t.add_column("task", no_wrap=True)
        t.add_column("state", no_wrap=True)
        t.add_column("try", justify="right")
        t.add_column("time", justify="right", no_wrap=True)
        now = time.time()
        with self.lock:
            tasks = [TaskProgress(**vars(s)) for s in self.tasks.values()]
        for st in tasks:
            secs = st.seconds
            if secs is None and st.state == "running" and st.started:
                secs = now - st.started
            t.add_row(
                Text(st.label),
                # a Text, not markup: the live display renders the table with the options of
                # whatever is being printed above it (markup off for the progress lines)
                Text(st.state, style=COLOUR.get(st.state, "white")),
                str(st.try_number or ""),
                "" if secs is None else _duration(secs),
            )
        return Group(Text(self.title, no_wrap=True, overflow="ellipsis"), t)
