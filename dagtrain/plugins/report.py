"""What the training page shows of a run, assembled from the run's artifacts.

Everything comes from files the stages wrote under the pipeline's artifact root (found
through the run's ``prepare_data`` XCom, whose ``dir`` is ``<root>/data/<version>``):
``runs/<run>/train/`` (``config.json``, ``result.json``, ``metrics.jsonl``, ``traces/``,
``failure-try<N>.json``), ``runs/<run>/eval.json`` and ``registry/registry.json``. Every
path is resolved and must stay inside that root. Plain functions of plain data (no
FastAPI, no Airflow): ``dagtrain.plugins.app`` feeds them what it reads through
Airflow's ORM, and tests call them directly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "artifact_root",
    "config_diff",
    "epochs_of",
    "merged_trace",
    "registry_of",
    "run_dir_of",
    "run_report",
]

_TRACE = re.compile(r"^step-rank(\d+)\.json$")


def artifact_root(prep_output: Any) -> Path | None:
    """The pipeline's artifact root from ``prepare_data``'s output, or None."""
    if not isinstance(prep_output, dict) or not isinstance(prep_output.get("dir"), str):
        return None
    return Path(prep_output["dir"]).resolve().parents[1]


def _inside(root: Path, path: Path) -> Path:
    p = path.resolve()
    if not p.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the pipeline's artifact root")
    return p


def run_dir_of(root: Path, run_id: str) -> Path:
    from dagtrain.stages.files import run_dir

    return _inside(root, run_dir(root, run_id))


def _json(root: Path, path: Path) -> Any:
    p = _inside(root, path)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _lines(root: Path, path: Path) -> list[dict[str, Any]]:
    p = _inside(root, path)
    try:
        text = p.read_text()
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue  # a line still being written
    return out


def epochs_of(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per epoch (the newest try's, when a retry trained it again)."""
    rows: dict[int, dict[str, Any]] = {}
    for m in metrics:
        if m.get("kind") == "epoch":
            rows[int(m["epoch"])] = {k: v for k, v in m.items() if k != "kind"}
    return [rows[e] for e in sorted(rows)]


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and k != "args":
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def config_diff(effective: dict[str, Any], other: dict[str, Any] | None) -> list[dict]:
    """Fields of the sections ``effective`` has whose value differs in ``other``."""
    if not other:
        return []
    mine = _flatten({k: v for k, v in effective.items() if isinstance(v, dict)})
    theirs = _flatten({k: other.get(k) for k in effective if isinstance(effective[k], dict)})
    return [
        {"field": k, "run": mine[k], "other": theirs.get(k)}
        for k in sorted(mine)
        if k in theirs and theirs[k] != mine[k]
    ]


def _sync_figures(events: list[dict[str, Any]], result: dict | None) -> dict[str, Any]:
    """Buckets (from the result), allreduce time and the share of it hidden under
    backward (from one rank's step trace), skipped non-finite steps."""
    spans = [e for e in events if e.get("ph") == "X"]
    ar = [e for e in spans if str(e.get("name", "")).startswith("allreduce")]
    fb = [e for e in spans if e.get("name") == "forward-backward"]
    total = sum(float(e.get("dur", 0)) for e in ar)
    hidden = 0.0
    for b in fb:
        b0, b1 = float(b["ts"]), float(b["ts"]) + float(b.get("dur", 0))
        for e in ar:
            e0, e1 = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            hidden += max(0.0, min(b1, e1) - max(b0, e0))
    sizes = (result or {}).get("bucket_bytes") or []
    return {
        "buckets": len(sizes),
        "bucket_bytes": sizes,
        "allreduce_ms": total / 1000,
        "hidden_share": hidden / total if total else None,
        "skipped_steps": (result or {}).get("skipped_steps"),
    }


def _traces(root: Path, run: Path) -> dict[int, list[dict[str, Any]]]:
    d = run / "train" / "traces"
    out: dict[int, list[dict[str, Any]]] = {}
    if not d.is_dir():
        return out
    for f in sorted(d.iterdir()):
        m = _TRACE.match(f.name)
        doc = _json(root, f) if m else None
        if isinstance(doc, dict):
            out[int(m.group(1))] = doc.get("traceEvents", [])
    return out


def merged_trace(root: Path, run_id: str) -> dict[str, Any]:
    """Every rank's step trace as one Perfetto/Chrome trace (each rank a process)."""
    events = [e for evs in _traces(root, run_dir_of(root, run_id)).values() for e in evs]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _ranks(result: dict | None, traces: dict[int, list], failures: list[dict]) -> list[dict]:
    world = int((result or {}).get("world") or (max(traces) + 1 if traces else 0))
    failed = {f.get("rank"): f for f in failures if f.get("rank") is not None}
    rows = []
    for r in range(world):
        spans = [e for e in traces.get(r, []) if e.get("ph") == "X"]
        step = None
        if spans:
            t0 = min(float(e["ts"]) for e in spans)
            t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in spans)
            step = (t1 - t0) / 1000
        f = failed.get(r)
        rows.append(
            {
                "rank": r,
                "status": "failed" if f else ("done" if result else "unknown"),
                "how": f.get("how") if f else None,
                "last_lines": f.get("log_tail", [])[-8:] if f else [],
                "last_step_ms": step,
            }
        )
    steps = [row["last_step_ms"] for row in rows if row["last_step_ms"] is not None]
    if len(steps) > 1 and max(steps) > min(steps):  # a tie has no slowest rank
        slowest = max(rows, key=lambda row: row["last_step_ms"] or 0)
        slowest["slowest"] = True
    return rows


def registry_of(root: Path) -> dict[str, Any]:
    reg = _json(root, root / "registry" / "registry.json")
    return reg if isinstance(reg, dict) else {"champion": None, "versions": []}


def run_report(
    root: Path,
    run_id: str,
    stages: list[dict[str, Any]],
    file_config: dict[str, Any] | None,
    data: dict[str, Any] | None,
) -> dict[str, Any]:
    """The page's view of one run; ``stages`` are its task instances, ``file_config``
    the DAG's Params (the file's values), ``data`` the prepare_data output."""
    run = run_dir_of(root, run_id)
    train = run / "train"
    result = _json(root, train / "result.json")
    config = _json(root, train / "config.json")
    metrics = _lines(root, train / "metrics.jsonl")
    failures = [
        f
        for f in (_json(root, p) for p in sorted(train.glob("failure-try*.json")))
        if isinstance(f, dict)
    ]
    traces = _traces(root, run)
    registry = registry_of(root)
    champ = next(
        (v for v in registry["versions"] if v["version"] == registry.get("champion")), None
    )
    champ_config = (champ or {}).get("lineage", {}).get("config_values")
    tries = [
        {"try": i + 1, "resumed_from_step": m.get("resumed_from_step"), "time": m.get("time")}
        for i, m in enumerate(x for x in metrics if x.get("kind") == "start")
    ]
    return {
        "run_id": run_id,
        "stages": stages,
        "epochs": epochs_of(metrics),
        "config": config,
        "config_vs_file": config_diff(config or {}, file_config),
        "config_vs_champion": config_diff(config or {}, champ_config),
        "champion": None if champ is None else champ["version"],
        "data": data,
        "tries": tries,
        "result": None
        if result is None
        else {k: v for k, v in result.items() if k not in ("config", "epochs")},
        "evaluation": _json(root, run / "eval.json"),
        "sync": _sync_figures(traces.get(0, []), result) if traces or result else None,
        "ranks": _ranks(result, traces, failures),
        "failures": failures,
    }
