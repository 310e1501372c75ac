"""What the training page shows of a run, assembled from the run's artifacts.

Everything comes from files the phases wrote under the pipeline's artifact root (found
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

from pathlib import Path
from typing import Any

from dagtrain.changes import change_line
from dagtrain.config import OBJECTIVE_METRICS, dotted
from dagtrain.records import metrics
from dagtrain.records.layout import (
    TRAIN_TASK,
    ArtifactLayout,
    round_sync_task,
    round_train_task,
)
from dagtrain.records.metrics import Tries, TryEvent
from dagtrain.records.result import metric_names
from dagtrain.records.status import RankRecord, State

from . import tracking_links
from .artifacts import (
    artifact_root,
    as_int,
    failure_records,
    inside,
    rank_records,
    read_json,
    read_lines,
    run_dir_of,
    run_layout,
)
from .steps import (
    bubble_of,
    critical_path,
    end_of,
    hidden_share,
    last_step,
    merged_trace,
    pipeline_of,
    spans_of,
    step_list,
    step_traces,
    sync_figures,
)

__all__ = [
    "artifact_root",
    "bubble_of",
    "config_diff",
    "critical_path",
    "curves_of",
    "merged_trace",
    "metrics_of",
    "pipeline_of",
    "progress_of",
    "promotion_metric",
    "registry_of",
    "run_dir_of",
    "run_report",
    "tries_of",
]


def progress_of(root: Path, dag_id: str, run_id: str, after: float = 0.0) -> list[dict[str, Any]]:
    """Rank 0's progress lines of the run's training tasks written after time ``after``,
    oldest first, each with ``file``: its metrics file, relative to the run's folder
    (``train/metrics.jsonl``, ``rounds/round-01/shard-00/metrics.jsonl``)."""
    run = run_layout(root, dag_id, run_id)
    out = []
    for f in (t.metrics for t in run.training_folders()):
        rel = f.relative_to(run.dir).as_posix()
        out += [m | {"file": rel} for m in read_lines(root, f) if float(m.get("time") or 0) > after]
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


def _newest_job(statuses: dict[int, RankRecord]) -> str | None:
    """The launcher's job id of the newest world: the job of the record begun last."""
    jobs = [st for st in statuses.values() if st.job is not None]
    newest = max(jobs, key=lambda st: float(st.started or st.updated or 0), default=None)
    return None if newest is None else newest.job


def _rank_row(r: int, status: str, st: RankRecord) -> dict[str, Any]:
    return {
        "rank": r,
        "status": status,
        "host": st.host,
        "stage": as_int(st.stage),  # a pipeline-parallel run's; else None
        "replica": as_int(st.replica),
        "step": st.step,
        "total_steps": st.total_steps,
        "samples_per_second": st.samples_per_second,
        "median_step_ms": st.median_step_ms,
        "p95_step_ms": st.p95_step_ms,
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
                _rank_row(r, "left", RankRecord(r, host=host))
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
    statuses: dict[int, RankRecord],
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
    earlier = {r for r, st in statuses.items() if job is not None and st.job != job}
    now = [r for r in statuses if r not in earlier]
    sized = as_int(changes[-1].get("to")) if changes else None
    world = int(
        (result or {}).get("world")
        or (max([sized - 1, *now]) + 1 if sized else None)
        or max([*statuses, *traces, *(f.get("rank") or 0 for f in failures), -1]) + 1
    )
    failure = failures[-1] if failures and result is None else None
    rows = []
    for r in range(world):
        st = statuses.get(r) or RankRecord(r)
        spans = spans_of(traces.get(r, []))
        failed = failure is not None and failure.get("rank") == r
        if result is not None:
            status = "done"
        elif failed:
            status = "failed"
        elif failure is not None or r in earlier:
            status = "stopped"  # the launcher stops the others when one rank fails
        elif r not in statuses:
            status = "waiting" if train_state == "running" else "unknown"
        elif st.status in (State.STARTING, State.RUNNING) and train_state not in ("running", None):
            status = "stopped"
        else:
            status = st.status
        row = _rank_row(r, status, st) | {"earlier_world": r in earlier and result is None}
        if spans:
            row["last_step_ms"] = (
                max(map(end_of, spans)) - min(float(e["ts"]) for e in spans)
            ) / 1000
        if failed:
            row.update(
                host=failure.get("host") or st.host,
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


# a world line's fields, as the report lists them (dagtrain.training.driver.elastic)
_CHANGE = ("change", "step", "from", "to", "ranks", "hosts", "why", "steps_lost", "seconds", "time")


def _change_row(n: int, m: dict[str, Any]) -> dict[str, Any]:
    return {"try": n, **{k: m.get(k) for k in _CHANGE}, "line": change_line(m)}


def tries_of(
    metrics: list[dict[str, Any]], failures: list[dict[str, Any]], try_number: int | None = None
) -> list[dict[str, Any]]:
    """Every try the training task had, oldest first: from its ``metrics`` lines, grouped
    into tries by :class:`dagtrain.records.metrics.Tries` (each ``start`` line belongs to
    the newest ``try`` line before it; a file without any numbers its starts 1, 2, ...),
    its failure files, and Airflow's ``try_number`` (tries 1..N). Each: ``try``,
    ``started``, ``resumed_from_step``, ``epochs_done_before``, ``time`` (training's
    start, else the try's), ``failure``
    (its ``failure-try<N>.json`` record, or None), ``world_changes`` (an elastic run's
    ``world`` lines after the try's ``try`` line, oldest first, each with ``try`` and
    ``line``, the change as a sentence). A try's first ``start`` line says where it
    began; the later ones are an elastic run's relaunches on a new world."""
    rows: dict[int, dict[str, Any]] = {}
    tries = Tries()
    for m in metrics:
        got = tries.feed(m)
        if got is None:
            continue
        row = rows.setdefault(got.number, _try_row(got.number))
        if got.what == TryEvent.TRY and not row["started"]:
            row["time"] = m.get("time")
        elif got.what == TryEvent.WORLD:
            row["world_changes"].append(_change_row(got.number, m))
        elif got.what == TryEvent.START:
            row.update(
                started=True,
                resumed_from_step=got.resumed_from_step,
                epochs_done_before=got.epochs_done_before,
                time=m.get("time"),
            )
    for f in failures:
        n = f.get("try")
        if isinstance(n, int) and n > 0:
            rows.setdefault(n, _try_row(n))["failure"] = f
    for n in range(1, int(try_number or 0) + 1):
        rows.setdefault(n, _try_row(n))
    return [rows[n] for n in sorted(rows)]


def metrics_of(epochs: list[dict[str, Any]]) -> list[str]:
    """The objective's metrics the epoch rows report (their ``train_<m>`` keys:
    :func:`dagtrain.records.result.metric_names`), the loss first, as the page draws
    their curves; a metric that only an earlier row reports (an objective changed
    between tries) after the newest row's."""
    names: list[str] = []
    for row in reversed(epochs):
        names += [n for n in metric_names(row) if n not in names]
    return sorted(names, key=lambda n: n != "loss")  # stable: the objective's order kept


def promotion_metric(
    values: dict[str, Any] | None,
    tested: dict[str, Any] | None = None,
    reported: list[str] | None = None,
) -> str:
    """The metric a pipeline promotes on, as ``PipelineConfig.promotion_metric`` says it,
    from a config's values (a DAG's Params, a registry entry's lineage
    ``config_values``, a run's config: each section a dict): ``evaluation.metric``,
    else the built-in objective's first on the test split (``test_mse``), else
    ``test_loss`` (the author's own objective). Without values: the first but the loss
    of ``reported`` (the objective's metrics, as epoch rows report them), else
    ``test_accuracy`` where ``tested`` (a version's metrics) has it, else ``test_loss``."""
    if isinstance(values, dict):
        evaluation = values.get("evaluation")
        chosen = evaluation.get("metric") if isinstance(evaluation, dict) else None
        if isinstance(chosen, str) and chosen:
            return chosen
        objective = values.get("objective")
        name = objective.get("name") if isinstance(objective, dict) else None
        known = OBJECTIVE_METRICS.get(name or "classification")
        return f"test_{next(iter(known))}" if known else "test_loss"
    first = next((m for m in reported or [] if m != "loss"), None)
    if first is not None:
        return f"test_{first}"
    return "test_accuracy" if "test_accuracy" in (tested or {}) else "test_loss"


def registry_of(root: Path) -> dict[str, Any]:
    """The registry, with ``metric``: the metric the pipeline promotes on (its newest
    entry's config's, :func:`promotion_metric`), and ``columns``: the metrics the page's
    table shows of each version (that one, then the test loss)."""
    reg = read_json(root, ArtifactLayout(root).registry_file)
    reg = reg if isinstance(reg, dict) else {"champion": None, "versions": []}
    versions = [v for v in reg.get("versions") or [] if isinstance(v, dict)]
    newest = versions[-1] if versions else {}
    lineage = newest.get("lineage") if isinstance(newest.get("lineage"), dict) else {}
    metric = promotion_metric(lineage.get("config_values"), newest.get("metrics"))
    columns = list(dict.fromkeys([metric, "test_loss"]))
    return reg | {
        "metric": metric,
        "columns": columns,
        "mlflow": tracking_links.version_links(root),
    }


def curves_of(root: Path, dag_id: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """Each run's per-epoch metrics (runs without any left out), for overlaid curves,
    with ``metrics``: the objective's metrics its rows report (:func:`metrics_of`)."""
    out = []
    for run_id in run_ids:
        epochs = metrics.epochs(read_lines(root, run_layout(root, dag_id, run_id).train.metrics))
        if epochs:
            out.append({"run_id": run_id, "epochs": epochs, "metrics": metrics_of(epochs)})
    return out


def _rounds(root: Path, run: Any, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round-based pipelines: per round, each shard's contribution and the global
    model the round produced (its validation metrics); ``metric``: the objective's
    first metric (``accuracy``, ``mse``, ``perplexity``), each shard's ``val`` its
    last epoch's, on the validation split (``val_accuracy`` kept, a classification's)."""
    state = {(s["task_id"], s.get("map_index", -1)): s.get("state") for s in tasks}
    out = []
    for r in run.round_numbers():
        shards = []
        metric = "accuracy"
        for k, sd in run.shards_of(r).items():
            res = read_json(root, sd.result) or {}
            epochs = metrics.epochs(read_lines(root, sd.metrics))
            last = epochs[-1] if epochs else {}
            names = metrics_of(epochs)  # the loss first: the objective's first after it
            metric = next(iter(names[1:] or names), metric)
            shards.append(
                {
                    "shard": k,
                    "state": state.get((round_train_task(r), k)),
                    "contributed": inside(root, sd.delta_sidecar).exists(),
                    "steps": res.get("steps"),
                    "samples_per_second": res.get("samples_per_second"),
                    "val_accuracy": res.get("val_accuracy") or last.get("val_accuracy"),
                    "val": last.get(f"val_{metric}"),
                }
            )
        out.append(
            {
                "round": r,
                "sync_state": state.get((round_sync_task(r), -1)),
                "metric": metric,
                "shards": shards,
                "global": read_json(root, run.round_result(r)),
            }
        )
    return out


def run_report(
    root: Path,
    dag_id: str,
    run_id: str,
    tasks: list[dict[str, Any]],
    file_config: dict[str, Any] | None,
    data: dict[str, Any] | None,
) -> dict[str, Any]:
    """The page's view of one run; ``tasks`` are its task instances (the JSON's
    ``stages``, the page's "Stages" table: names users know, kept), ``file_config`` the
    DAG's Params (the file's values), ``data`` the prepare_data output."""
    run = run_layout(root, dag_id, run_id)
    train = run.train
    result = read_json(root, train.result)
    config = read_json(root, train.config)
    lines = read_lines(root, train.metrics)
    failures = [f.to_dict() | {"try": n} for n, f in failure_records(root, train).items()]
    files = train.trace_files()
    last = step_traces(root, files.get(last_step(files), {}))
    registry = registry_of(root)
    champ = next(
        (v for v in registry["versions"] if v["version"] == registry.get("champion")), None
    )
    champ_config = (champ or {}).get("lineage", {}).get("config_values")
    train_state = next((s["state"] for s in tasks if s["task_id"] == TRAIN_TASK), None)
    train_try = next((s.get("try_number") for s in tasks if s["task_id"] == TRAIN_TASK), None)
    tries = tries_of(lines, failures, train_try)
    told = (result or {}).get("world_changes")
    if tries and isinstance(told, list) and not any(t["world_changes"] for t in tries):
        # a metrics file without the world lines: the result's, the newest try's
        n = tries[-1]["try"]
        tries[-1]["world_changes"] = [_change_row(n, c) for c in told if isinstance(c, dict)]
    hidden = {r: hidden_share(evs) for r, evs in last.items()}
    statuses = rank_records(root, train)
    epochs = metrics.epochs(lines)
    names = metrics_of(epochs)
    evaluation = read_json(root, run.evaluation)
    evaluated = evaluation.get("metrics") if isinstance(evaluation, dict) else None
    return {
        "run_id": run_id,
        "stages": tasks,
        "epochs": epochs,
        "metrics": names,
        # the file's evaluation.metric, else the objective the ranks received
        "promotion_metric": promotion_metric(file_config or config, evaluated, names),
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
        "evaluation": evaluation,
        "sync": sync_figures(last.get(0, []), result) if last or result else None,
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
        "trace_steps": step_list(files, result),
        "rounds": _rounds(root, run, tasks),
        "mlflow": tracking_links.run_link(root, dag_id, run_id),
    }
