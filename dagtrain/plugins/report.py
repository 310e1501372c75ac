"""What the training page shows of a run, assembled from the run's artifacts.

Everything comes from files the stages wrote under the pipeline's artifact root (found
through the run's ``prepare_data`` XCom, whose ``dir`` is a prepared data folder), each
found through ``dagtrain.records.layout.ArtifactLayout``: the run's training folder (its
config, result, metrics, traces, rank records and failure records), its evaluation, its
rounds (round-based pipelines) and the registry. A pipeline-parallel run (its result's
``pipeline``, its rank records' ``stage`` and ``replica``) also gets each stage rank's
bubble, measured from its step trace (``pipeline_of``). An elastic run's world changes
(its metrics' ``world`` lines) are listed per try, and the ranks a shrink lost stay in the
ranks table, marked as left. Every path is resolved and must stay inside that root.
Plain functions of plain data (no FastAPI, no Airflow): ``dagtrain.plugins.app`` feeds
them what it reads through Airflow's ORM, and tests call them directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from dagtrain.changes import change_line
from dagtrain.config import dotted
from dagtrain.records import metrics
from dagtrain.records.layout import (
    TRAIN_TASK,
    ArtifactLayout,
    TrainFiles,
    round_sync_task,
    round_train_task,
)
from dagtrain.records.trace import Op, bubble, parse_op

from . import tracking_links

__all__ = [
    "artifact_root",
    "bubble_of",
    "config_diff",
    "critical_path",
    "curves_of",
    "merged_trace",
    "pipeline_of",
    "progress_of",
    "registry_of",
    "run_dir_of",
    "run_report",
    "tries_of",
]


def artifact_root(outlets: Any) -> Path | None:
    """The pipeline's artifact root from ``prepare_data``'s outlets (its data Asset, a
    ``file://`` URI of the root's data folder: ``pipelines.data_asset``), or None."""
    for a in outlets or ():
        name, uri = getattr(a, "name", ""), getattr(a, "uri", "")
        if name.startswith("dagtrain.") and name.endswith(".data"):
            parsed = urlparse(uri)
            if parsed.scheme == "file" and parsed.path:
                return ArtifactLayout.of_data_root(unquote(parsed.path)).root
    return None


def _inside(root: Path, path: Path) -> Path:
    p = path.resolve()
    if not p.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the pipeline's artifact root")
    return p


def run_dir_of(root: Path, dag_id: str, run_id: str) -> Path:
    """The folder of run ``run_id`` of DAG ``dag_id``, checked to be inside the root."""
    return _inside(root, ArtifactLayout(root, dag_id).run(run_id).dir)


def _run(root: Path, dag_id: str, run_id: str):
    """The run's layout, its folder checked to be inside the root."""
    run_dir_of(root, dag_id, run_id)
    return ArtifactLayout(root, dag_id).run(run_id)


def _json(root: Path, path: Path) -> Any:
    p = _inside(root, path)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _lines(root: Path, path: Path) -> list[dict[str, Any]]:
    return metrics.read(_inside(root, path))


def progress_of(root: Path, dag_id: str, run_id: str, after: float = 0.0) -> list[dict[str, Any]]:
    """Rank 0's progress lines of the run's training tasks written after time ``after``,
    oldest first, each with ``file``: its metrics file, relative to the run's folder
    (``train/metrics.jsonl``, ``rounds/round-01/shard-00/metrics.jsonl``)."""
    run = _run(root, dag_id, run_id)
    out = []
    for f in (t.metrics for t in run.training_folders()):
        rel = f.relative_to(run.dir).as_posix()
        out += [m | {"file": rel} for m in _lines(root, f) if float(m.get("time") or 0) > after]
    return sorted(out, key=lambda m: float(m.get("time") or 0))


def config_diff(effective: dict[str, Any], other: dict[str, Any] | None) -> list[dict]:
    """Fields of the sections ``effective`` has whose value differs in ``other``."""
    if not other:
        return []
    mine = dotted({k: v for k, v in effective.items() if isinstance(v, dict)})
    theirs = dotted({k: other.get(k) for k in effective if isinstance(effective[k], dict)})
    return [
        {"field": k, "run": mine[k], "other": theirs.get(k)}
        for k in sorted(mine)
        if k in theirs and theirs[k] != mine[k]
    ]


def _spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X"]


def _end(e: dict[str, Any]) -> float:
    return float(e["ts"]) + float(e.get("dur", 0))


def critical_path(events: list[dict[str, Any]]) -> list[int]:
    """The task indices (``args.index``) of one rank's step that set its length: from
    the op that ended last, back through the op each waited for that ended last
    (``args.after``). Empty for a trace without dependences."""
    by_index = {e.get("args", {}).get("index"): e for e in _spans(events)}
    by_index.pop(None, None)
    if not by_index:
        return []
    cur = max(by_index.values(), key=_end)
    path = []
    while cur is not None:
        path.append(cur["args"]["index"])
        before = [by_index[i] for i in cur["args"].get("after", []) if i in by_index]
        cur = max(before, key=_end) if before else None
    return path[::-1]


def _is_backward(name: str) -> bool:
    """The data-parallel step's forward-backward, a pipeline stage's B and W ops."""
    op = parse_op(name)
    return name == "forward-backward" or (op is not None and op[0] in (Op.BACKWARD, Op.WEIGHT))


def _hidden_share(events: list[dict[str, Any]]) -> tuple[float, float | None]:
    """(allreduce milliseconds, the share of it that ran while backward did: the
    data-parallel step's forward-backward, a pipeline stage's B and W ops)."""
    spans = _spans(events)
    ar = [e for e in spans if str(e.get("name", "")).startswith("allreduce")]
    fb = [e for e in spans if _is_backward(str(e.get("name", "")))]
    total = sum(float(e.get("dur", 0)) for e in ar)
    hidden = 0.0
    for b in fb:
        for e in ar:
            hidden += max(0.0, min(_end(b), _end(e)) - max(float(b["ts"]), float(e["ts"])))
    return total / 1000, (hidden / total if total else None)


def _sync_figures(events: list[dict[str, Any]], result: dict | None) -> dict[str, Any]:
    """Buckets (from the result), allreduce time and the share of it hidden under
    backward (from one rank's step trace), skipped non-finite steps."""
    ms, share = _hidden_share(events)
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
    ops = [(str(e.get("name", "")), float(e["ts"]), _end(e)) for e in _spans(events)]
    got = bubble(ops)
    if got is None:
        return None
    share, busy, span = got
    return {"bubble": share, "busy_ms": busy / 1000, "span_ms": span / 1000}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def pipeline_of(
    traces: dict[int, list[dict[str, Any]]],
    statuses: dict[int, dict[str, Any]],
    result: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """A pipeline-parallel run's figures for one traced step, or None for a
    data-parallel run (no ``pipeline`` in its result, no ``stage`` in a rank record).

    From the result's ``pipeline``: ``stages``, ``replicas``, ``microbatches``,
    ``order``, ``split``, ``blocks``, ``peak_activation_bytes`` and the result's own
    ``bubble`` (as ``reported_bubble``); ``reference_bubble`` is (S-1)/(M+S-1), GPipe's
    and 1F1B's bubble, when the result says the order. ``ranks``: each rank's stage and
    replica (its record's; rank 0's from the result if its record has none) and its
    measured ``bubble`` (``bubble_of``); ``mean_bubble`` their mean."""
    p = (result or {}).get("pipeline")
    p = p if isinstance(p, dict) else None
    stage_of = {r: _int(st.get("stage")) for r, st in statuses.items()}
    replica_of = {r: _int(st.get("replica")) for r, st in statuses.items()}
    if p is None and all(s is None for s in stage_of.values()):
        return None
    p = p or {}
    if stage_of.get(0) is None and _int(p.get("stage")) is not None:
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
    stages = _int(p.get("stages")) or (max(known) + 1 if known else None)
    replicas = _int(p.get("replicas")) or (
        len({d for d in replica_of.values() if d is not None}) or None
    )
    m = _int(p.get("microbatches"))
    measured = [x["bubble"] for x in ranks if x["bubble"] is not None]
    reference = None
    if p.get("order") and stages and m:
        reference = (stages - 1) / (m + stages - 1)
    return {
        "stages": stages,
        "replicas": replicas,
        "microbatches": m,
        "order": p.get("order"),
        "split": p.get("split"),
        "blocks": p.get("blocks"),
        "peak_activation_bytes": p.get("peak_activation_bytes"),
        "reported_bubble": p.get("bubble"),
        "reference_bubble": reference,
        "ranks": ranks,
        "mean_bubble": sum(measured) / len(measured) if measured else None,
    }


def _step_traces(root: Path, files: dict[int, Path]) -> dict[int, list[dict[str, Any]]]:
    """{rank: trace events} of one traced step's files."""
    out = {}
    for rank, f in files.items():
        doc = _json(root, f)
        if isinstance(doc, dict):
            out[rank] = doc.get("traceEvents", [])
    return out


def _last_step(files: dict[int | None, dict[int, Path]]) -> int | None:
    """The step a report shows: the run's last if traced, else the newest epoch's."""
    if None in files or not files:
        return None
    return max(k for k in files if k is not None)


def _step_list(files: dict, result: dict | None) -> list[dict[str, Any]]:
    """The traced steps, oldest first: ``{"step": S or None, "label": ...}``."""
    last = (result or {}).get("steps")
    rows = [{"step": s, "label": f"step {s}"} for s in sorted(k for k in files if k is not None)]
    if None in files:
        rows.append({"step": None, "label": f"step {last} (last)" if last else "last step"})
    return rows


def merged_trace(root: Path, dag_id: str, run_id: str, step: int | None = None) -> dict[str, Any]:
    """Every rank's trace of one traced step (default: the run's last) as one
    Perfetto/Chrome trace: each rank a process, the ops on each rank's critical path
    marked ``args.critical``. A pipeline-parallel run's processes are named
    ``rank N · stage s``, and ``otherData.pipeline`` holds that step's
    ``pipeline_of`` (each stage rank's bubble)."""
    train = _run(root, dag_id, run_id).train
    files = train.trace_files()
    if step is not None and step not in files:
        raise LookupError(f"step {step} was not traced; traced: {sorted(k for k in files if k)}")
    traces = _step_traces(root, files.get(step, {}))
    pipeline = pipeline_of(traces, _statuses(root, train), _json(root, train.result))
    stage_of = {x["rank"]: x["stage"] for x in (pipeline or {}).get("ranks", [])}
    events = []
    for rank, evs in traces.items():
        crit = set(critical_path(evs))
        named = False
        for e in evs:
            if e.get("ph") == "X" and e.get("args", {}).get("index") in crit:
                e = {**e, "args": {**e["args"], "critical": True}}
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


def _statuses(root: Path, train: TrainFiles) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for f in train.rank_records().values():
        doc = _json(root, f)
        if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
            out[doc["rank"]] = doc
    return out


def _newest_job(statuses: dict[int, dict[str, Any]]) -> Any:
    """The launcher's job id of the newest world: the job of the record begun last."""
    jobs = [st for st in statuses.values() if st.get("job") is not None]
    newest = max(
        jobs, key=lambda st: float(st.get("started") or st.get("updated") or 0), default={}
    )
    return newest.get("job")


def _rank_row(r: int, status: str, st: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": r,
        "status": status,
        "host": st.get("host"),
        "stage": _int(st.get("stage")),  # a pipeline-parallel run's; else None
        "replica": _int(st.get("replica")),
        "step": st.get("step"),
        "total_steps": st.get("total_steps"),
        "samples_per_second": st.get("samples_per_second"),
        "median_step_ms": st.get("median_step_ms"),
        "p95_step_ms": st.get("p95_step_ms"),
        "how": None,
        "exit_code": None,
        "signal": None,
        "last_lines": [],
        "last_step_ms": None,
        "earlier_world": False,  # its record was written by the ranks of an earlier world
        "left_at_step": None,  # a rank a shrink lost: where the world went on without it
        "left_world": None,  # the size of the world it left
        "back_at_step": None,  # where a later world took its host back
    }


def _left(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per rank the shrinks among ``changes`` (one try's, oldest first) lost, as
    the world it left numbered it, with the step its host came back at, if it did."""
    rows = []
    for i, c in enumerate(changes):
        lost, hosts = c.get("ranks") or [], c.get("hosts") or []
        if c.get("change") != "shrink":
            continue
        for k, r in enumerate(lost):
            host = hosts[k] if len(hosts) == len(lost) else ", ".join(map(str, hosts)) or None
            back = next(
                (
                    g.get("step")
                    for g in changes[i + 1 :]
                    if g.get("change") == "grow" and host in (g.get("hosts") or [])
                ),
                None,
            )
            rows.append(
                _rank_row(r, "left", {"host": host})
                | {
                    "how": c.get("why"),
                    "left_at_step": c.get("step"),
                    "left_world": c.get("from"),
                    "back_at_step": back,
                }
            )
    return rows


def _ranks(
    result: dict | None,
    traces: dict[int, list],
    statuses: dict[int, dict[str, Any]],
    failures: list[dict],
    train_state: str | None,
    changes: list[dict[str, Any]] | None = None,
) -> list[dict]:
    """A row per rank: status, host, figures, and how it failed (the newest try's
    failure, unless a later try succeeded); the slowest rank marked. ``changes``: the
    newest try's world changes: the world's size is the last one's until the result
    says it, and each rank a shrink lost gets a row after the others (status ``left``,
    ``left_at_step``, ``how``). A record an earlier world's rank wrote (another job's
    than the newest record's) shows as ``stopped``, never running."""
    changes = changes or []
    job = _newest_job(statuses)
    earlier = {r for r, st in statuses.items() if job is not None and st.get("job") != job}
    now = [r for r in statuses if r not in earlier]
    sized = _int(changes[-1].get("to")) if changes else None
    world = int(
        (result or {}).get("world")
        or (max([sized - 1, *now]) + 1 if sized else None)
        or max([*statuses, *traces, *(f.get("rank") or 0 for f in failures), -1]) + 1
    )
    failure = failures[-1] if failures and result is None else None
    rows = []
    for r in range(world):
        st = statuses.get(r, {})
        spans = _spans(traces.get(r, []))
        failed = failure is not None and failure.get("rank") == r
        if result is not None:
            status = "done"
        elif failed:
            status = "failed"
        elif failure is not None or r in earlier:
            status = "stopped"  # the launcher stops the others when one rank fails
        elif st.get("status") in ("starting", "running") and train_state not in ("running", None):
            status = "stopped"
        else:
            status = st.get("status") or ("waiting" if train_state == "running" else "unknown")
        row = _rank_row(r, status, st) | {"earlier_world": r in earlier and result is None}
        if spans:
            row["last_step_ms"] = (
                max(map(_end, spans)) - min(float(e["ts"]) for e in spans)
            ) / 1000
        if failed:
            row.update(
                host=failure.get("host") or st.get("host"),
                how=failure.get("how"),
                exit_code=failure.get("exit_code"),
                signal=failure.get("signal"),
                last_lines=failure.get("log_tail", [])[-8:],
            )
        rows.append(row)
    key = "median_step_ms" if all(r["median_step_ms"] for r in rows) else "last_step_ms"
    times = [row[key] for row in rows if row[key] is not None]
    if len(times) > 1 and max(times) > min(times):  # a tie has no slowest rank
        max(rows, key=lambda row: row[key] or 0)["slowest"] = True
    return rows + _left(changes)


def _try_row(n: int) -> dict[str, Any]:
    return {
        "try": n,
        "started": False,  # whether training started (rank 0 wrote its start line)
        "resumed_from_step": None,
        "epochs_done_before": None,
        "time": None,
        "failure": None,
        "world_changes": [],  # an elastic run's: its world lines after this try's try line
    }


# a world line's fields, as the report lists them (dagtrain.training.elastic)
_CHANGE = ("change", "step", "from", "to", "ranks", "hosts", "why", "steps_lost", "seconds", "time")


def _change_row(n: int, m: dict[str, Any]) -> dict[str, Any]:
    return {"try": n, **{k: m.get(k) for k in _CHANGE}, "line": change_line(m)}


def tries_of(
    metrics: list[dict[str, Any]], failures: list[dict[str, Any]], try_number: int | None = None
) -> list[dict[str, Any]]:
    """Every try the training task had, oldest first: from its ``try`` lines (each
    ``start`` line belongs to the newest ``try`` line before it; a file without any
    numbers its starts 1, 2, ...), its failure files, and Airflow's ``try_number``
    (tries 1..N). Each: ``try``, ``started``, ``resumed_from_step``,
    ``epochs_done_before``, ``time`` (training's start, else the try's), ``failure``
    (its ``failure-try<N>.json`` record, or None), ``world_changes`` (an elastic run's
    ``world`` lines after the try's ``try`` line, oldest first, each with ``try`` and
    ``line``, the change as a sentence). A try's first ``start`` line says where it
    began; the later ones are an elastic run's relaunches on a new world."""
    rows: dict[int, dict[str, Any]] = {}
    current: int | None = None
    for m in metrics:
        kind = m.get("kind")
        if kind == "try" and isinstance(m.get("try"), int):
            current = m["try"]
            row = rows.setdefault(current, _try_row(current))
            if not row["started"]:
                row["time"] = m.get("time")
        elif kind == "world":
            n = max(rows, default=1) if current is None else current
            rows.setdefault(n, _try_row(n))["world_changes"].append(_change_row(n, m))
        elif kind == "start":
            # a file written before try lines existed: one start a try
            n = max(rows, default=0) + 1 if current is None else current
            row = rows.setdefault(n, _try_row(n))
            if row["started"]:
                continue  # an elastic run's relaunch: the try began at its first start
            resumed = m.get("resumed_from_step")
            per = m.get("steps_per_epoch")
            row.update(
                started=True,
                resumed_from_step=resumed,
                epochs_done_before=(resumed or 0) // per if per else None,
                time=m.get("time"),
            )
    for f in failures:
        n = f.get("try")
        if isinstance(n, int) and n > 0:
            rows.setdefault(n, _try_row(n))["failure"] = f
    for n in range(1, int(try_number or 0) + 1):
        rows.setdefault(n, _try_row(n))
    return [rows[n] for n in sorted(rows)]


def registry_of(root: Path) -> dict[str, Any]:
    reg = _json(root, ArtifactLayout(root).registry_file)
    reg = reg if isinstance(reg, dict) else {"champion": None, "versions": []}
    return reg | {"mlflow": tracking_links.version_links(root)}


def curves_of(root: Path, dag_id: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """Each run's per-epoch metrics (runs without any left out), for overlaid curves."""
    out = []
    for run_id in run_ids:
        epochs = metrics.epochs(_lines(root, _run(root, dag_id, run_id).train.metrics))
        if epochs:
            out.append({"run_id": run_id, "epochs": epochs})
    return out


def _rounds(root: Path, run: Any, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round-based pipelines: per round, each shard's contribution and the global
    model the round produced (its validation metrics)."""
    state = {(s["task_id"], s.get("map_index", -1)): s.get("state") for s in stages}
    out = []
    for r in run.round_numbers():
        shards = []
        for k, sd in run.shards_of(r).items():
            res = _json(root, sd.result) or {}
            epochs = metrics.epochs(_lines(root, sd.metrics))
            shards.append(
                {
                    "shard": k,
                    "state": state.get((round_train_task(r), k)),
                    "contributed": _inside(root, sd.delta_sidecar).exists(),
                    "steps": res.get("steps"),
                    "samples_per_second": res.get("samples_per_second"),
                    "val_accuracy": res.get("val_accuracy")
                    or (epochs[-1].get("val_accuracy") if epochs else None),
                }
            )
        out.append(
            {
                "round": r,
                "sync_state": state.get((round_sync_task(r), -1)),
                "shards": shards,
                "global": _json(root, run.round_result(r)),
            }
        )
    return out


def run_report(
    root: Path,
    dag_id: str,
    run_id: str,
    stages: list[dict[str, Any]],
    file_config: dict[str, Any] | None,
    data: dict[str, Any] | None,
) -> dict[str, Any]:
    """The page's view of one run; ``stages`` are its task instances, ``file_config``
    the DAG's Params (the file's values), ``data`` the prepare_data output."""
    run = _run(root, dag_id, run_id)
    train = run.train
    result = _json(root, train.result)
    config = _json(root, train.config)
    lines = _lines(root, train.metrics)
    failures = [
        f | {"try": n}
        for n, f in ((n, _json(root, p)) for n, p in train.failures().items())
        if isinstance(f, dict)
    ]
    files = train.trace_files()
    last = _step_traces(root, files.get(_last_step(files), {}))
    registry = registry_of(root)
    champ = next(
        (v for v in registry["versions"] if v["version"] == registry.get("champion")), None
    )
    champ_config = (champ or {}).get("lineage", {}).get("config_values")
    train_state = next((s["state"] for s in stages if s["task_id"] == TRAIN_TASK), None)
    train_try = next((s.get("try_number") for s in stages if s["task_id"] == TRAIN_TASK), None)
    tries = tries_of(lines, failures, train_try)
    told = (result or {}).get("world_changes")
    if tries and isinstance(told, list) and not any(t["world_changes"] for t in tries):
        # a metrics file without the world lines: the result's, the newest try's
        n = tries[-1]["try"]
        tries[-1]["world_changes"] = [_change_row(n, c) for c in told if isinstance(c, dict)]
    hidden = {r: _hidden_share(evs) for r, evs in last.items()}
    statuses = _statuses(root, train)
    return {
        "run_id": run_id,
        "stages": stages,
        "epochs": metrics.epochs(lines),
        "config": config,
        "config_vs_file": config_diff(config or {}, file_config),
        "config_vs_champion": config_diff(config or {}, champ_config),
        "champion": None if champ is None else champ["version"],
        "data": data,
        "tries": tries,
        "world_changes": [c for t in tries for c in t["world_changes"]],
        "result": None
        if result is None
        else {k: v for k, v in result.items() if k not in ("config", "epochs")},
        "evaluation": _json(root, run.evaluation),
        "sync": _sync_figures(last.get(0, []), result) if last or result else None,
        "sync_by_rank": [
            {"rank": r, "allreduce_ms": ms, "hidden_share": share}
            for r, (ms, share) in sorted(hidden.items())
        ],
        "ranks": _ranks(
            result,
            last,
            statuses,
            failures,
            train_state,
            tries[-1]["world_changes"] if tries else [],
        ),
        "pipeline": pipeline_of(last, statuses, result),
        "failures": failures,
        "trace_steps": _step_list(files, result),
        "rounds": _rounds(root, run, stages),
        "mlflow": tracking_links.run_link(root, dag_id, run_id),
    }
