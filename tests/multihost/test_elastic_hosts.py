"""An elastic pipeline across hosts for real: three network-namespace hosts (A and B
run the Celery workers, C runs ranks only), ``ranks: 3``, ``min_ranks: 2``, MPI ranks
through the rsh agent, the DAG run through the scheduler (see conftest.py).

- Every process of host C killed mid-training, C unreachable: the run goes on with two
  ranks in the same try; C reachable again: it is taken back at the next epoch and the
  last epochs run on three ranks. The try succeeds, the task's log says each change.
- Two of the three hosts lost at once: fewer than ``min_ranks`` answer, the try fails
  naming the rank and the host, and the retry starts on the hosts that answer (B is
  back, C is not) instead of failing on C.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dagtrain.records.layout import safe_name
from dagtrain.records.status import read_records

from .conftest import ELASTIC, Cluster, kill_namespace, marked, wait_for

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

DAG = f"dagtrain_{ELASTIC}"


def _training(ranks: Path) -> int:
    """How many ranks of the newest job say they are training."""
    recs = list(read_records(ranks).values())
    newest = max(recs, key=lambda r: r.started or 0).job if recs else None
    return sum(1 for r in recs if r.job == newest and r.status == "running")


def _world(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [m for m in lines if m.get("kind") == "world"]


def _task_log(cluster: Cluster, run_id: str, attempt: int) -> str:
    found = list((cluster.home / "logs" / "tasks").rglob(f"attempt={attempt}.log"))
    mine = [p for p in found if f"dag_id={DAG}" in str(p) and "task_id=train" in str(p)]
    mine = [p for p in mine if f"run_id={run_id}" in str(p)]
    return "\n".join(p.read_text(errors="replace") for p in mine)


def _no_ranks_left(cluster: Cluster) -> None:
    def none() -> bool:
        return not [
            p
            for p in marked(cluster.net.tag)
            if "dagtrain.training.rank"
            in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        ]

    wait_for("no rank left", none, 20)


def _start_training(cluster: Cluster):
    """Every host up, the elastic DAG triggered, and its 3 ranks training: (the REST
    client, the run id, the train task's folder)."""
    net = cluster.net
    net.up(*net.every)
    cluster.ensure_workers()
    client = cluster.client()
    client.unpause(DAG)
    run_id = client.trigger(DAG, {})["dag_run_id"]
    out = cluster.artifacts / ELASTIC / "runs" / DAG / safe_name(run_id) / "train"
    wait_for("3 ranks training", lambda: _training(out / "ranks") == 3, 420, every=0.1)
    return client, run_id, out


@pytest.mark.timeout(1200)
def test_host_c_lost_the_run_goes_on_with_two_and_takes_c_back_in_the_same_try(cluster):
    net, c = cluster.net, cluster.net.spare[0]
    client, run_id, out = _start_training(cluster)
    time.sleep(3.0)  # mid-epoch
    net.down(c)
    assert kill_namespace(c.netns) > 0
    wait_for("the world shrinking", lambda: len(_world(out)) >= 1, 120, every=0.2)
    shrink = _world(out)[0]
    assert (shrink["change"], shrink["from"], shrink["to"]) == ("shrink", 3, 2), shrink
    assert shrink["hosts"] == [c.address] and shrink["ranks"] == [2], shrink
    assert shrink["steps_lost"] is not None and shrink["steps_lost"] <= 1, shrink
    net.up(c)  # C answers again: taken back at the next epoch's end
    wait_for("host C taken back", lambda: len(_world(out)) >= 2, 180, every=0.2)
    grow = _world(out)[1]
    assert (grow["change"], grow["from"], grow["to"]) == ("grow", 2, 3), grow
    assert grow["hosts"] == [c.address] and grow["step"] > shrink["step"], grow

    run = client.wait(DAG, run_id, timeout=600, every=2)
    assert run["state"] == "success", (run, cluster.logs())
    tries = cluster.train_tries(client, DAG, run_id)
    assert list(tries) == [1], tries  # the same try
    summary = client.xcom(DAG, run_id, "train")
    assert summary["world"] == 3, summary  # the last epochs on three ranks
    assert [w["change"] for w in summary["world_changes"]] == ["shrink", "grow"], summary
    assert set(summary["placement"].values()) == {h.hostname for h in net.every}, summary
    log = _task_log(cluster, run_id, 1)
    assert "world 3 -> 2 ranks" in log and "world 2 -> 3 ranks" in log, log[-3000:]
    _no_ranks_left(cluster)


@pytest.mark.timeout(1200)
def test_below_min_ranks_the_try_fails_named_and_the_retry_starts_on_the_hosts_that_answer(
    cluster,
):
    net, c = cluster.net, cluster.net.spare[0]
    client, run_id, out = _start_training(cluster)
    ti = client._send("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/train").json()
    other = next(h for h in net.hosts if h.hostname != ti["hostname"])  # not the launcher's
    time.sleep(2.0)
    net.down(other, c)
    t_kill = time.monotonic()
    kill_namespace(other.netns)  # its Celery worker too: the whole host is gone
    kill_namespace(c.netns)
    failure = out / "failure-try1.json"
    wait_for("try 1 failing", failure.exists, 60, every=0.1)
    assert time.monotonic() - t_kill < 30
    why = json.loads(failure.read_text())
    lost = {net.every.index(other): other, 2: c}
    assert why["rank"] in lost, why
    assert lost[why["rank"]].hostname in why["how"], why
    net.up(other)  # B is back before the retry; C is not
    cluster.ensure_workers()

    run = client.wait(DAG, run_id, timeout=600, every=2)
    assert run["state"] == "success", (run, cluster.logs())
    states = cluster.train_tries(client, DAG, run_id)
    assert states[1] == "failed" and states[max(states)] == "success", states
    summary = client.xcom(DAG, run_id, "train")
    assert summary["world"] == 2 and not summary["world_changes"], summary
    assert c.hostname not in summary["placement"].values(), summary
    assert summary["resumed_from_step"], summary  # from what the survivors saved
    log = _task_log(cluster, run_id, max(states))
    assert f"host {c.address} does not answer" in log, log[-3000:]
    _no_ranks_left(cluster)
