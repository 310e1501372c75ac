"""Plots of the committed benchmark results, for docs/benchmarks.md.

    .venv/bin/python benchmarks/plots.py [--results benchmarks/results] [--out docs/images]

Reads the JSON files the benchmark scripts write (``results/*.json``) and writes one PNG
per figure, ``docs/images/bench-*.png``; it measures nothing. A result file that is
missing is skipped with a line saying so. matplotlib comes with the ``bench`` extra.

Figures:

- ``bench-overhead.png``   executor overhead per task on the 100x100 stencil: build,
                           first run, build+run, replay (taskgraph_overhead.json)
- ``bench-patterns.png``   build+run and replay per task on the Task-Bench patterns
- ``bench-metg.png``       efficiency against task grain, and METG(50%)
- ``bench-schedule.png``   our static schedules' makespan over saga's HEFT and CPoP,
                           per random DAG (schedule_vs_saga.json)
- ``bench-train.png``      training samples/s: dagtrain, DDP, Horovod (train_throughput.json)
- ``bench-parse.png``      Airflow's parse time of each example DAG file (dag_parse.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("minimal", "dagtrain", "threadpool", "dask")
COLOURS = {
    "sequential": "#9e9e9e",
    "minimal": "#607d8b",
    "dagtrain": "#1565c0",
    "dagtrain replay": "#42a5f5",
    "dagtrain inline replay": "#90caf9",
    "dagtrain-threaded": "#0d47a1",
    "threadpool": "#ef6c00",
    "dask": "#c62828",
    "ddp": "#ef6c00",
    "horovod": "#6a1b9a",
}


def _machine(data: dict[str, Any]) -> str:
    parts = [f"{data['cpus']} cores" if "cpus" in data else "", data.get("date", "")]
    return ", ".join(p for p in parts if p)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    # no creation date or version in the file: the same results give the same bytes
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def overhead(results: Path, out: Path) -> Path:
    data = json.loads((results / "taskgraph_overhead.json").read_text())
    row = data["us_per_task"]["stencil 100x100"]
    phases = [("build", "build"), ("first", "first run"), ("build_run", "build+run"),
              ("replay", "replay")]  # fmt: skip
    # dagtrain as a user runs it, and with the team from the first task (inline_below=0)
    systems = [s for s in ("minimal", "dagtrain", "dagtrain-threaded", "threadpool", "dask")
               if s in row]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        at = [(p, row[system][key]) for p, (key, _) in enumerate(phases) if key in row[system]]
        values = [v for _, v in at]
        xs = [p + (i - (len(systems) - 1) / 2) * width for p, _ in at]
        bars = ax.bar(xs, values, width, label=system, color=COLOURS[system])
        ax.bar_label(bars, fmt="%.2g", fontsize=7, padding=1)
    labels = [label for _, label in phases]
    inline = row["dagtrain"].get("replay_inline")
    if inline is not None:  # dagtrain's alone: a replay on the calling thread
        bar = ax.bar([len(phases)], [inline], width, color=COLOURS["dagtrain inline replay"])
        ax.bar_label(bar, fmt="%.2g", fontsize=7, padding=1)
        labels.append("inline replay\n(dagtrain)")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_ylim(top=max(row[s]["build_run"] for s in systems) * 8)  # room for the legend
    ax.set_ylabel("µs per task (median, log scale)")
    ax.set_title(
        f"Executor overhead, 100x100 3-point stencil ({row['tasks']:,} empty tasks), "
        f"{data['workers']} workers; {_machine(data)}",
        fontsize=10,
    )
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.grid(axis="y", which="major", alpha=0.3)
    return _save(fig, out / "bench-overhead.png")


def patterns(results: Path, out: Path) -> Path:
    data = json.loads((results / "taskgraph_overhead.json").read_text())
    rows = {k: v for k, v in data["us_per_task"].items() if k != "stencil 100x100"}
    names = list(rows)
    series: list[tuple[str, Callable[[dict], float]]] = [
        ("minimal", lambda r: r["minimal"]["build_run"]),
        ("dagtrain", lambda r: r["dagtrain"]["build_run"]),
        ("dagtrain replay", lambda r: r["dagtrain"]["replay"]),
        ("dagtrain inline replay", lambda r: r["dagtrain"]["replay_inline"]),
        ("threadpool", lambda r: r["threadpool"]["build_run"]),
        ("dask", lambda r: r["dask"]["build_run"]),
    ]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    width = 0.8 / len(series)
    for i, (label, get) in enumerate(series):
        xs = [p + (i - (len(series) - 1) / 2) * width for p in range(len(names))]
        ax.bar(xs, [get(rows[n]) for n in names], width, label=label, color=COLOURS[label])
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("µs per task (median, log scale)")
    tasks = {rows[n]["tasks"] for n in names}
    ax.set_title(
        f"Task-Bench patterns, width 16 (~{max(tasks):,} tasks): build+run, and dagtrain's "
        f"replays; {_machine(data)}",
        fontsize=10,
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 8)  # room for the legend
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.grid(axis="y", which="major", alpha=0.3)
    return _save(fig, out / "bench-patterns.png")


def metg(results: Path, out: Path) -> Path:
    data = json.loads((results / "taskgraph_overhead.json").read_text())
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, entry in data["metg"].items():
        grain, eff = zip(*entry["curve"])
        colour = COLOURS.get(name.replace("-", " "), COLOURS.get(name))
        ax.plot(grain, eff, marker="o", ms=3, color=colour,
                label=f"{name}: METG {entry['metg_us']:.1f} µs")  # fmt: skip
    ax.axhline(0.5, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("task grain (µs of work per task, log scale)")
    ax.set_ylabel("efficiency (n·g / workers·wall)")
    ax.set_title(
        f"METG(50%): stencil of width 8, {data['workers']} workers; {_machine(data)}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out / "bench-metg.png")


def schedule(results: Path, out: Path) -> Path:
    data = json.loads((results / "schedule_vs_saga.json").read_text())
    inst = data["instances"]
    fig, ax = plt.subplots(figsize=(7, 4))
    n = [i["n"] for i in inst]
    ax.scatter(n, [i["ours"] / i["heft"] for i in inst], s=14, color=COLOURS["dagtrain"],
               label=f"ours / HEFT (mean {data['summary']['mean_ratio_vs_heft']:.3f})")  # fmt: skip
    ax.scatter(n, [i["ours"] / i["cpop"] for i in inst], s=14, marker="x", color="#9e9e9e",
               label=f"ours / CPoP (mean {data['summary']['mean_ratio_vs_cpop']:.3f})")  # fmt: skip
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("tasks in the DAG (log scale)")
    ax.set_ylabel("makespan ratio (below 1: ours is shorter)")
    ax.set_title(
        f"Static schedules vs anrg-saga, {len(inst)} random DAGs (seed {data['seed']}); "
        f"{data['date']}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out / "bench-schedule.png")


def train(results: Path, out: Path) -> Path:
    data = json.loads((results / "train_throughput.json").read_text())
    models = data["results"]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.2), squeeze=False)
    for ax, (model, res) in zip(axes[0], models.items()):
        names = list(res["samples_per_s"])
        med = [res["samples_per_s"][k] for k in names]
        rounds = res.get("rounds_samples_per_s", {})
        lo = [m - min(rounds.get(k, [m])) for k, m in zip(names, med)]
        hi = [max(rounds.get(k, [m])) - m for k, m in zip(names, med)]
        colours = [COLOURS.get(k.split(" ")[0], COLOURS["dagtrain"]) for k in names]
        colours = [
            COLOURS["dagtrain replay"] if "plain" in k else c for k, c in zip(names, colours)
        ]
        hatches = ["//" if k.endswith("mpi") else "" for k in names]  # mpi4py, not gloo
        bars = ax.bar(
            range(len(names)), med, yerr=[lo, hi], capsize=3, color=colours, hatch=hatches
        )
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax.set_xticks(range(len(names)), [k.replace("dagtrain ", "dagtrain\n") for k in names],
                      fontsize=7)  # fmt: skip
        batch = res.get("batch", data["batch"])
        repeats = res.get("measured", {}).get("repeats", data["repeats"])
        ax.set_title(f"{model}, batch {batch}: samples/s (median of {repeats} rounds)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("samples / s (bars: min-max of the rounds)")
    fig.suptitle(
        f"Training throughput, {data['ranks']} ranks on {data['cpus']} cores (CPU); {data['date']}",
        fontsize=10,
    )
    return _save(fig, out / "bench-train.png")


def parse(results: Path, out: Path) -> Path:
    data = json.loads((results / "dag_parse.json").read_text())
    rows = data["rows"]
    files = [r["file"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, key, label in ((axes[0], "warm_ms", "warm"), (axes[1], "cold_ms", "cold")):
        # the baselines (an empty DAG, the same shape without Params) are not in dags/
        colours = [
            COLOURS["dagtrain"] if (ROOT / "dags" / f).exists() else COLOURS["minimal"]
            for f in files
        ]
        bars = ax.barh(range(len(files)), [r[key] for r in rows], color=colours)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
        ax.set_xlabel(f"{label} parse, ms (median)")
        ax.set_xlim(0, max(r[key] for r in rows) * 1.15)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(files)), files, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"Airflow's parse time of each DAG file (DagBag); {data['date']}", fontsize=10)
    return _save(fig, out / "bench-parse.png")


FIGURES: dict[str, tuple[str, Callable[[Path, Path], Path]]] = {
    "overhead": ("taskgraph_overhead.json", overhead),
    "patterns": ("taskgraph_overhead.json", patterns),
    "metg": ("taskgraph_overhead.json", metg),
    "schedule": ("schedule_vs_saga.json", schedule),
    "train": ("train_throughput.json", train),
    "parse": ("dag_parse.json", parse),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (source, plot) in FIGURES.items():
        if not (args.results / source).exists():
            print(f"{name}: skipped, no {args.results / source}", file=sys.stderr)
            continue
        print(plot(args.results, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
