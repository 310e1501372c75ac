"""Ctrl-C counted as presses: a copy of one SIGINT that arrives within a fraction of a
second (a wrapper such as ``timeout`` forwarding the terminal's) is the same press; a
person's second press, later, is the second. And a run the stop marked failed stays
failed, whatever Airflow's loop wrote after the mark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from dagtrain.cli.stop import SAME_PRESS, Interrupts


def test_a_forwarded_copy_is_one_press_and_a_later_press_the_second():
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT)  # (ignored, under nohup)
    interrupts = Interrupts(seen.append).install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the copy, microseconds later
        assert (interrupts.count, seen, interrupts.name) == (1, [1], "Ctrl-C")
        time.sleep(SAME_PRESS + 0.1)
        os.kill(os.getpid(), signal.SIGINT)
        assert (interrupts.count, seen) == (2, [1, 2])
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_closed_terminal_stops_as_ctrl_c_does():
    seen: list[int] = []
    before = signal.getsignal(signal.SIGHUP)
    interrupts = Interrupts(seen.append).install()
    try:
        os.kill(os.getpid(), signal.SIGHUP)  # its default would end the command at once
        assert (interrupts.count, seen, interrupts.name) == (1, [1], "SIGHUP")
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGHUP) is before


DAG_FILE = """
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("two", schedule=None):
    EmptyOperator(task_id="a") >> EmptyOperator(task_id="b")
"""

SAID = ("marked ", "the loop's ", "again ", "left ", "overwritten ", "stray", "b ")

# what dag.test()'s loop does around a stop: it reads the run as running, the stop marks
# it failed (a, running, failed; b skipped), the loop's update_state judges the leaves
RACE = """
from datetime import UTC, datetime

from airflow import settings
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
from airflow.models.dagbag import DBDagBag
from airflow.models.dagrun import get_or_create_dagrun
from airflow.utils.db import initdb
from airflow.utils.session import create_session
from airflow.utils.state import TaskInstanceState
from airflow.utils.types import DagRunTriggeredByType

from dagtrain.cli.stop import fail_again, fail_run, fail_strays, run_id_for

initdb()
manager = DagBundlesManager()
with create_session() as session:
    manager.sync_bundles_to_db(session=session)
bundle = manager.get_bundle("dags-folder")
bundle.initialize()
bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
sync_bag_to_db(bag, bundle.name, bundle.version)
when = datetime(2026, 1, 1, tzinfo=UTC)
run_id = run_id_for(when)
loop = settings.Session()
dag = DBDagBag().get_latest_version_of_dag("two", session=loop)
dr = get_or_create_dagrun(
    dag=dag, run_id=run_id, logical_date=when, data_interval=None, run_after=when,
    start_date=when, conf=None, triggered_by=DagRunTriggeredByType.TEST,
    triggering_user_name="test", session=loop,
)
dr.dag = dag
dr.get_task_instance("a", session=loop).set_state(TaskInstanceState.RUNNING, session=loop)
loop.commit()
assert dr.state == "running"
print("marked", fail_run("two", run_id))
loop.expire_all()  # as the loop does before update_state, which reads the run afresh
dr.update_state(session=loop)
loop.commit()
print("the loop's", dr.state)
print("again", fail_run("two", run_id))
fail_again("two", run_id, "success")  # the stop had found it ended: left alone
print("left", fail_run("two", run_id))
fail_again("two", run_id, "failed")
print("overwritten", fail_run("two", run_id))
print("strays before", fail_strays("two", run_id))
# the other race: the loop had read b as ready just before the mark, and writes
# scheduled over the mark's skipped (then queues it: skipped again); or b had started
# before the second mark (failed: its supervisor terminates it)
for state in (TaskInstanceState.SCHEDULED, TaskInstanceState.RUNNING):
    loop.expire_all()
    dr.get_task_instance("b", session=loop).state = state
    loop.commit()
    print("strays", state, fail_strays("two", run_id))
    loop.expire_all()
    print("b", dr.get_task_instance("b", session=loop).state)
    print("strays after", fail_strays("two", run_id))
"""


def test_a_stopped_run_that_airflows_loop_finished_as_a_success_or_ran_on_is_stopped_again(
    tmp_path,
):
    """The race that once failed CI (test_ctrl_c_during_evaluation_stops_it: the run
    'success'), played in order against a real Airflow database: the mark, then the
    loop's update_state, which writes success (no leaf failed); ``fail_again`` marks the
    run failed again where the stop had marked it, and leaves alone a run the stop had
    found ended as a success, as ``fail_run`` without ``overwritten`` does. Then the other
    race: a task the loop scheduled over the mark's ``skipped`` is skipped again by
    ``fail_strays`` (and one that had started is failed), which does nothing where no
    task is left alive."""
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "two.py").write_text(DAG_FILE)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }
    argv = [sys.executable, "-c", RACE]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = [line for line in r.stdout.splitlines() if line.startswith(SAID)]
    assert said == [
        "marked failed",
        "the loop's success",
        "again success",
        "left success",
        "overwritten failed",
        "strays before []",
        "strays scheduled ['b']",
        "b skipped",
        "strays after []",
        "strays running ['b']",
        "b failed",
        "strays after []",
    ]


def test_strays_marks_only_a_run_its_stop_marked_failed_and_at_most_three_times(monkeypatch):
    """``Strays.poll``: nothing before the stop has marked the run failed (or where it
    found the run ended); then ``fail_strays`` each poll until 3 marks have succeeded;
    an error is said and the next poll tries again."""
    from dagtrain.cli import stop

    calls: list[str] = []

    def fail_strays(dag_id: str, run_id: str) -> list[str]:
        calls.append(run_id)
        if len(calls) == 2:
            raise RuntimeError("database is locked")
        return ["b"] if len(calls) != 3 else []

    monkeypatch.setattr(stop, "fail_strays", fail_strays)
    said: list[str] = []
    strays = stop.Strays("d", "r", said.append)
    strays.poll(None)
    strays.poll("success")
    assert calls == []
    for _ in range(8):
        strays.poll("failed")
    # marks at calls 1, 4 and 5; call 2 failed, call 3 found nothing
    assert len(calls) == 5 and strays.marks == stop.STRAY_MARKS == 3
    assert said == ["dagtrain: stopping the run's tasks: database is locked"]
