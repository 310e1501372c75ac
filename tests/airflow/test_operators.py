"""DistributedTrainOperator leaves no rank behind: on_kill, and an execution timeout."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from dagtrain.operators import DataPrepOperator, DistributedTrainOperator

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


@pytest.fixture
def slow_pipeline(tmp_path, monkeypatch):
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(
        "name: slow\ndata: {source: digits}\n"
        "model: {name: 'tests.unit.training.factory:slow', args: {seconds: 0.2}}\n"
        "training: {epochs: 50}\ndistributed: {backend: mpi, ranks: 2}\n"
        f"artifacts: {{root: {tmp_path / 'art'}}}\n"
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("DAGTRAIN_PID_DIR", str(pids))
    ctx = {"run_id": "manual__t", "dag_run": SimpleNamespace(conf={}), "outlet_events": {}}
    data = DataPrepOperator(task_id="prep", config=cfg).execute(ctx)
    return SimpleNamespace(cfg=cfg, ctx=ctx, data=data, pids=pids)


def rank_pids(pids: Path, n: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(pids.glob("rank*.pid"))
        if len(files) == n:
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"ranks did not start: {list(pids.iterdir())}")


def test_on_kill_stops_every_rank(slow_pipeline):
    s = slow_pipeline
    op = DistributedTrainOperator(task_id="train", config=s.cfg, data=s.data)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(s.ctx)
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=run)
    t.start()
    pids = rank_pids(s.pids, 2)
    op.on_kill()
    t.join(30)
    assert not t.is_alive()
    assert failure, "the killed task must fail, not succeed"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a rank survived on_kill"


def test_execution_timeout_stops_every_rank(slow_pipeline):
    s = slow_pipeline
    op = DistributedTrainOperator(
        task_id="train", config=s.cfg, data=s.data, execution_timeout=timedelta(seconds=10)
    )
    with pytest.raises(TimeoutError):
        op.execute(s.ctx)
    # on a loaded machine a rank may still be importing torch when the timeout comes
    # (it has not written its pid yet): every process the task started carries the
    # pid folder in its environment, the launcher's and a rank not yet started included
    pids = [int(f.read_text()) for f in s.pids.glob("rank*.pid")]
    assert pids, "no rank started within the timeout: the test did not kill a running rank"
    deadline = time.monotonic() + 10
    while (left := started_by(s.pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes survived the timeout: {left}"
    assert not any(alive(p) for p in pids), "a rank survived the timeout"


def started_by(pids: Path) -> list[str]:
    """The live processes whose environment names this test's pid folder."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        try:
            if p.environ().get("DAGTRAIN_PID_DIR") == str(pids):
                found.append(f"{p.pid} {p.info['name']}")
        except (psutil.Error, OSError):
            continue
    return found
