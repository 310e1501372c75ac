"""What the training page shows of a run's step traces: the critical path of a rank's
step, the gradient sync's figures (allreduce time, the share hidden under backward), a
pipeline-parallel run's stage ranks and their bubbles, and every rank's trace of one
step merged into one (Perfetto's format), each rank a lane."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagtrain.records.status import RankRecord
from dagtrain.records.trace import Op, bubble, op_args, parse_op

from .artifacts import as_int, rank_records, read_json, run_layout

__all__ = [
    "bubble_of",
    "critical_path",
    "end_of",
    "hidden_share",
    "last_step",
    "merged_trace",
    "pipeline_of",
    "spans_of",
    "step_list",
    "step_traces",
    "sync_figures",
]


def spans_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X"]


def end_of(e: dict[str, Any]) -> float:
    return float(e["ts"]) + float(e.get("dur", 0))


def critical_path(events: list[dict[str, Any]]) -> list[int]:
    """The task indices (``args.index``) of one rank's step that set its length: from
    the op that ended last, back through the op each waited for that ended last
    (``args.after``). Empty for a trace without dependences."""
    by_index = {e.get("args", {}).get("index"): e for e in spans_of(events)}
    by_index.pop(None, None)
    if not by_index:
        return []
    cur = max(by_index.values(), key=end_of)
    path = []
    while cur is not None:
        path.append(cur["args"]["index"])
        before = [by_index[i] for i in cur["args"].get("after", []) if i in by_index]
        cur = max(before, key=end_of) if before else None
    return path[::-1]


def _is_backward(name: str) -> bool:
    """The data-parallel step's forward-backward, a pipeline stage's B and W ops."""
    op = parse_op(name)
    return name == "forward-backward" or (op is not None and op[0] in (Op.BACKWARD, Op.WEIGHT))


def hidden_share(events: list[dict[str, Any]]) -> tuple[float, float | None]:
    """(allreduce milliseconds, the share of it that ran while backward did: the
    data-parallel step's forward-backward, a pipeline stage's B and W ops)."""
    spans = spans_of(events)
    ar = [e for e in spans if str(e.get("name", "")).startswith("allreduce")]
    fb = [e for e in spans if _is_backward(str(e.get("name", "")))]
    total = sum(float(e.get("dur", 0)) for e in ar)
    hidden = 0.0
    for b in fb:
        for e in ar:
            hidden += max(0.0, min(end_of(b), end_of(e)) - max(float(b["ts"]), float(e["ts"])))
    return total / 1000, (hidden / total if total else None)


def sync_figures(events: list[dict[str, Any]], result: dict | None) -> dict[str, Any]:
    """Buckets (from the result), allreduce time and the share of it hidden under
    backward (from one rank's step trace), skipped non-finite steps."""
    ms, share = hidden_share(events)
    sizes = (result or {}).get("bucket_bytes") or []
    return {
        "none": _no_sync(result),
        "buckets": len(sizes),
        "bucket_bytes": sizes,
        "allreduce_ms": ms,
        "hidden_share": share,
        "skipped_steps": (result or {}).get("skipped_steps"),
    }


def _no_sync(result: dict | None) -> str | None:
    """Why a run has no gradient sync between ranks (None: it has one, or it is not
    known yet): one rank, or a pipeline whose stages each have one replica."""
    result = result or {}
    p = result.get("pipeline") if isinstance(result.get("pipeline"), dict) else None
    if p and p.get("replicas") == 1:
        return (
            f"no gradient sync: each of the {p.get('stages')} pipeline stages has one "
            "replica, so no two ranks hold the same parameters to average (a stage's "
            "gradients stay on its rank; activations and their gradients move between "
            "stages instead)"
        )
    if result.get("world") == 1:
        return "no gradient sync: one rank, nothing to average"
    return None


def bubble_of(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One stage rank's bubble in one traced step (:func:`dagtrain.records.trace.bubble`,
    the definition the step's result uses too), its busy and span milliseconds. None
    for a trace without F/B/W ops."""
    ops = [(str(e.get("name", "")), float(e["ts"]), end_of(e)) for e in spans_of(events)]
    got = bubble(ops)
    if got is None:
        return None
    share, busy, span = got
    return {"bubble": share, "busy_ms": busy / 1000, "span_ms": span / 1000}


def pipeline_of(
    traces: dict[int, list[dict[str, Any]]],
    statuses: dict[int, RankRecord],
    result: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """A pipeline-parallel run's figures for one traced step, or None for a
    data-parallel run (no ``pipeline`` in its result, no ``stage`` in a rank record).

    From the result's ``pipeline``: ``stages``, ``replicas``, ``microbatches``,
    ``order``, ``split``, ``blocks``, ``peak_activation_bytes`` and the result's own
    ``bubble`` (as ``reported_bubble``), ``chunks`` and ``order_trial``;
    ``reference_bubble`` is (S-1)/(M+S-1), GPipe's and 1F1B's bubble, or with v chunks a
    rank (S-1)/(vM+S-1), the interleaved orders', when the result says the order.
    ``ranks``: each rank's stage and replica (its record's; rank 0's from the result if
    its record has none) and its
    measured ``bubble`` (``bubble_of``); ``mean_bubble`` their mean."""
    p = (result or {}).get("pipeline")
    p = p if isinstance(p, dict) else None
    stage_of = {r: as_int(st.stage) for r, st in statuses.items()}
    replica_of = {r: as_int(st.replica) for r, st in statuses.items()}
    if p is None and all(s is None for s in stage_of.values()):
        return None
    p = p or {}
    if stage_of.get(0) is None and as_int(p.get("stage")) is not None:
        stage_of[0] = p["stage"]
    ranks = []
    for r in sorted(set(traces) | {r for r, s in stage_of.items() if s is not None}):
        figures = bubble_of(traces.get(r, [])) or {
            "bubble": None,
            "busy_ms": None,
            "span_ms": None,
        }
        ranks.append({"rank": r, "stage": stage_of.get(r), "replica": replica_of.get(r)} | figures)
    known = [s for s in stage_of.values() if s is not None]
    stages = as_int(p.get("stages")) or (max(known) + 1 if known else None)
    replicas = as_int(p.get("replicas")) or (
        len({d for d in replica_of.values() if d is not None}) or None
    )
    m = as_int(p.get("microbatches"))
    measured = [x["bubble"] for x in ranks if x["bubble"] is not None]
    v = as_int(p.get("chunks")) or 1
    reference = None
    if p.get("order") and stages and m:
        reference = (stages - 1) / (v * m + stages - 1)
    return {
        "stages": stages,
        "replicas": replicas,
        "microbatches": m,
        "chunks": v,
        "order": p.get("order"),
        "order_trial": p.get("order_trial"),
        "split": p.get("split"),
        "blocks": p.get("blocks"),
        "peak_activation_bytes": p.get("peak_activation_bytes"),
        "reported_bubble": p.get("bubble"),
        "reference_bubble": reference,
        "ranks": ranks,
        "mean_bubble": sum(measured) / len(measured) if measured else None,
    }


def step_traces(root: Path, files: dict[int, Path]) -> dict[int, list[dict[str, Any]]]:
    """{rank: trace events} of one traced step's files."""
    out = {}
    for rank, f in files.items():
        doc = read_json(root, f)
        if isinstance(doc, dict):
            out[rank] = doc.get("traceEvents", [])
    return out


def last_step(files: dict[int | None, dict[int, Path]]) -> int | None:
    """The step a report shows: the run's last if traced, else the newest epoch's."""
    if None in files or not files:
        return None
    return max(k for k in files if k is not None)


def step_list(files: dict, result: dict | None) -> list[dict[str, Any]]:
    """The traced steps, oldest first: ``{"step": S or None, "label": ...}``."""
    last = (result or {}).get("steps")
    rows = [{"step": s, "label": f"step {s}"} for s in sorted(k for k in files if k is not None)]
    if None in files:
        rows.append({"step": None, "label": f"step {last} (last)" if last else "last step"})
    return rows


def merged_trace(root: Path, dag_id: str, run_id: str, step: int | None = None) -> dict[str, Any]:
    """Every rank's trace of one traced step (default: the run's last) as one
    Perfetto/Chrome trace: each rank a process, the ops on each rank's critical path
    marked ``args.critical``, each pipeline op's span told what it is in its ``args``
    (``op``, ``microbatch``, and a transfer's ``way`` and ``carries``:
    :func:`dagtrain.records.trace.op_args`; the page's script reads these, never the
    names). A pipeline-parallel run's processes are named ``rank N · stage s``, and
    ``otherData.pipeline`` holds that step's ``pipeline_of`` (each stage rank's
    bubble)."""
    train = run_layout(root, dag_id, run_id).train
    files = train.trace_files()
    if step is not None and step not in files:
        raise LookupError(f"step {step} was not traced; traced: {sorted(k for k in files if k)}")
    traces = step_traces(root, files.get(step, {}))
    pipeline = pipeline_of(traces, rank_records(root, train), read_json(root, train.result))
    stage_of = {x["rank"]: x["stage"] for x in (pipeline or {}).get("ranks", [])}
    events = []
    for rank, evs in traces.items():
        crit = set(critical_path(evs))
        named = False
        for e in evs:
            if e.get("ph") == "X":
                args = e.get("args", {})
                mark = {"critical": True} if args.get("index") in crit else {}
                fields = op_args(str(e.get("name", ""))) | mark
                if fields:
                    e = {**e, "args": {**args, **fields}}
            if e.get("ph") == "M" and e.get("name") == "process_name":
                named = True
                if stage_of.get(e.get("pid")) is not None:
                    e = {**e, "args": {**e.get("args", {}), "name": _lane(e["pid"], stage_of)}}
            events.append(e)
        if not named and stage_of.get(rank) is not None:
            events.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": rank,
                    "tid": 0,
                    "args": {"name": _lane(rank, stage_of)},
                }
            )
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if pipeline is not None:
        out["otherData"] = {"pipeline": pipeline}
    return out


def _lane(rank: int, stage_of: dict[int, int | None]) -> str:
    return f"rank {rank} · stage {stage_of[rank]}"
