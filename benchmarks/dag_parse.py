"""How long Airflow takes to parse each example DAG file, against an empty DAG file.

Two figures per file, each the median of several tries:

- warm: the file parsed again and again by ``DagBag`` in one process, with the modules
  it imports already loaded. This is the dag-processor's steady state (Airflow pre-imports
  a DAG file's imports in the parent before it forks a parser: ``parsing_pre_import_modules``).
- cold: a fresh interpreter that has imported ``airflow.sdk`` parses the file once, so
  dagtrain's own imports (config, operators, yaml, pydantic models) are counted.

The baseline is a DAG file with one EmptyOperator, measured in the same run; a second
file has the retraining DAG's shape (4 chained EmptyOperators, daily, no Params), to
tell Airflow's cost of the shape from ours. Results:
``benchmarks/results/dag_parse.json``. Run: ``make bench-parse``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMPTY = '''"""An empty Airflow DAG: the baseline."""
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("empty", schedule=None):
    EmptyOperator(task_id="nothing")
'''

SAME_SHAPE = '''"""The retraining DAG's shape (4 chained tasks, daily) with EmptyOperators and no
Params: what Airflow itself costs for that shape."""
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("same_shape", schedule="@daily", catchup=False):
    a, b, c, d = (EmptyOperator(task_id=t) for t in ("prep", "train", "eval", "promote"))
    a >> b >> c >> d
'''

COLD = """
import sys, time
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(sys.argv[1])
dt = time.perf_counter() - t
assert not bag.import_errors, bag.import_errors
print(dt)
"""


def warm(path: Path, tries: int) -> float:
    from airflow.dag_processing.dagbag import DagBag

    DagBag(str(path))  # first parse: imports
    times = []
    for _ in range(tries):
        t = time.perf_counter()
        bag = DagBag(str(path))
        times.append(time.perf_counter() - t)
        assert not bag.import_errors, bag.import_errors
    return statistics.median(times)


def cold(path: Path, tries: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(tries):
        out = subprocess.run(
            [sys.executable, "-c", COLD, str(path)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        times.append(float(out.strip().splitlines()[-1]))
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "AIRFLOW_HOME": tmp,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp}/a.db",
        }
        os.environ.update(env)
        empty = Path(tmp) / "empty_dag.py"
        empty.write_text(EMPTY)
        shape = Path(tmp) / "same_shape_dag.py"
        shape.write_text(SAME_SHAPE)
        files = [empty, shape, *sorted((REPO / "dags").glob("*.py"))]
        rows = []
        base_w = base_c = None
        for f in files:
            w = warm(f, 15)
            c = cold(f, 5, env)
            if f == empty:
                base_w, base_c = w, c
            rows.append(
                {
                    "file": f.name,
                    "warm_ms": round(w * 1e3, 2),
                    "cold_ms": round(c * 1e3, 1),
                    "warm_vs_empty": round(w / base_w, 2),
                    "cold_vs_empty": round(c / base_c, 2),
                }
            )
    print(f"{'file':28} {'warm ms':>8} {'x empty':>8} {'cold ms':>8} {'x empty':>8}")
    for r in rows:
        print(
            f"{r['file']:28} {r['warm_ms']:8.2f} {r['warm_vs_empty']:8.2f} "
            f"{r['cold_ms']:8.1f} {r['cold_vs_empty']:8.2f}"
        )
    out = REPO / "benchmarks" / "results" / "dag_parse.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
