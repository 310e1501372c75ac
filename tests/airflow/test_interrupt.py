"""Ctrl-C on ``dagtrain run`` in a real 80-column terminal: before training, during it
and during evaluation. The first Ctrl-C says so in one line, stops the run the way
Airflow stops one (the run marked failed, the running task terminated: its on_kill
ends the ranks and their launcher), prints the summary and exits 130; a second one
stops at once. Either way nothing the command started is left running and the run is
not left ``running``."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from dagtrain.cli.stop import SAME_PRESS

from .live import DAGTRAIN, REPO, Terminal, free_port, processes_of_home, run_states

pytestmark = pytest.mark.slow

STOPPING = "stopping the run … (press Ctrl-C again to stop at once)"


MPI = "{backend: mpi, ranks: 2}"


def pipeline(tmp_path: Path, model: str, epochs: int, distributed: str = MPI) -> Path:
    cfg = tmp_path / "dags" / "stop.yaml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(
        f"name: stop\nmodel: {model}\n"
        f"training: {{epochs: {epochs}, batch_size: 64, retries: 2, retry_delay_seconds: 0}}\n"
        f"distributed: {distributed}\n"
    )
    return cfg


SLOW_TRAIN = "{name: 'tests.unit.training.factory:slow', args: {seconds: 0.05}}"
SLOW_TO_STOP = "{name: 'tests.unit.training.factory:slow_to_stop', args: {seconds: 0.05}}"
SLOW_EVAL = "{name: 'tests.unit.training.factory:slow_to_evaluate', args: {seconds: 120}}"


def run_and_interrupt(
    tmp_path,
    model: str,
    when: str,
    ctrl_c: int = 1,
    sigterm=False,
    epochs: int = 200,
    wrapper: tuple[str, ...] = (),
    distributed: str = MPI,
):
    """``dagtrain run`` (under ``wrapper``, e.g. ``timeout 600``) interrupted once
    ``when`` is on the screen; its temporary files go to ``tmp_path/tmp`` (TMPDIR),
    which must be empty once it has stopped."""
    home = tmp_path / "home"
    (tmp_path / "tmp").mkdir()
    cfg = pipeline(tmp_path, model, epochs, distributed)
    env = {"DAGTRAIN_HOME": str(home), "TMPDIR": str(tmp_path / "tmp")}
    term = Terminal([*wrapper, *DAGTRAIN, "run", str(cfg)], env=env)
    term.wait_for(when)
    if sigterm:
        term.proc.send_signal(signal.SIGTERM)
    else:
        term.interrupt()
    if ctrl_c == 2:
        term.wait_for(STOPPING, timeout=30)
        time.sleep(SAME_PRESS + 0.2)  # a person's second press, not a copy of the first
        term.interrupt()
    code = term.wait(timeout=90)
    return code, term.text, home


def assert_stopped_cleanly(code: int, text: str, home: Path) -> list[str]:
    """What every stop must leave; returns the states of the pipeline's runs (none: it
    never reached the database), read once here (`airflow dags list-runs` starts an
    Airflow of its own: seconds of CPU)."""
    assert code == 130, text[-3000:]
    assert text.count(STOPPING) == 1, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    left = [str(p) for p in (home.parent / "tmp").rglob("*")]
    assert not left, left  # no temporary file of the run, whichever way it stopped
    deadline = time.monotonic() + 15  # everything the command started ends with it
    while processes_of_home(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [" ".join(p.cmdline()) for p in processes_of_home(home)]
    assert not left, left
    states = run_states(home, "dagtrain_stop") if (home / "airflow" / "airflow.db").exists() else []
    assert "running" not in states and "queued" not in states, states
    return states


def test_ctrl_c_while_training_stops_the_run_and_its_ranks(tmp_path):
    """Under ``timeout 600`` (as a user runs it): the one Ctrl-C reaches the command
    twice, the terminal's and the copy ``timeout`` forwards, and is one Ctrl-C, the
    orderly stop, not the stop at once."""
    # (once: it ran three times over to catch a flaky stop, 60 s each; make test runs
    # it on every landing, and the second Ctrl-C and SIGTERM tests stop the same way)
    code, text, home = run_and_interrupt(
        tmp_path, SLOW_TRAIN, "train epoch 2/200", wrapper=("timeout", "600")
    )
    states = assert_stopped_cleanly(code, text, home)
    assert "stopped at once" not in text, text[-3000:]
    assert re.search(r"run manual__\S+: failed in [\d.]+ s \(stopped by Ctrl-C\)", text), text
    assert "stopped: the run is marked failed; prepare_data, train ran, evaluate, promote" in (
        text.replace("\n", "")
    )
    assert states == ["failed"]
    # the task was terminated through Airflow: its on_kill ended the ranks, no retry
    log = next((home / "logs" / "airflow").rglob("task_id=train/attempt=1.log")).read_text()
    assert "killing every rank of the training job" in log
    assert not list((home / "logs" / "airflow").rglob("task_id=train/attempt=2.log"))


@pytest.mark.parametrize("attempt", [1, 2])
def test_ctrl_c_before_training_stops_before_any_rank_starts(tmp_path, attempt):
    when = "starting Airflow" if attempt == 1 else "prepare_data started"
    code, text, home = run_and_interrupt(tmp_path, SLOW_TRAIN, when)
    assert_stopped_cleanly(code, text, home)
    assert "train epoch" not in text


def test_ctrl_c_during_evaluation_stops_it(tmp_path):
    # two epochs: training is not what this test stops
    code, text, home = run_and_interrupt(tmp_path, SLOW_EVAL, "evaluate started", epochs=2)
    states = assert_stopped_cleanly(code, text, home)
    assert "train succeeded" in text and "promote" in text
    assert states == ["failed"]


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    # ranks that ignore SIGTERM, started directly: the orderly stop waits the training
    # task's kill grace (2 s) for them, so the second press (more than SAME_PRESS after
    # the first) lands while it runs, as a person's would. Not under mpirun: mpirun
    # SIGKILLs its ranks on SIGTERM within moments, and an orderly stop that happened to
    # begin right after the first press ended before the second (clean-clone run ci21)
    code, text, home = run_and_interrupt(
        tmp_path,
        SLOW_TO_STOP,
        "train epoch 2/200",
        ctrl_c=2,
        distributed="{backend: torch, ranks: 2, launcher: direct}",
    )
    assert_stopped_cleanly(code, text, home)
    assert "stopped at once: every process of the run was killed" in text


def test_sigterm_to_the_command_stops_the_run_as_ctrl_c_does(tmp_path):
    code, text, home = run_and_interrupt(tmp_path, SLOW_TRAIN, "train epoch 2/200", sigterm=True)
    assert_stopped_cleanly(code, text, home)
    assert "(stopped by SIGTERM)" in text
    assert REPO.exists()


@pytest.mark.parametrize("how", ["SIGHUP while its terminal is paused", "SIGKILL"])
def test_dagtrain_up_leaves_nothing_running_however_it_is_stopped(tmp_path, how):
    """``dagtrain up`` on a terminal: once it is up, stopped by SIGHUP (its window
    closed) with the terminal paused by Ctrl-S — its orderly stop would wait for the
    terminal to print, so a deadline stops Airflow without it; or, while it waits for its
    api-server, killed outright (its children have a parent-death signal)."""
    home = tmp_path / "home"
    argv = [*DAGTRAIN, "up", "--port", str(free_port()), "--home", str(home)]
    term = Terminal([*argv, "--dags", str(REPO / "dags")])
    term.wait_for("starting the log server", timeout=120)
    deadline = time.monotonic() + 60  # all five started
    while len(processes_of_home(home)) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    if how != "SIGKILL":
        # its spinner on a terminal once printed nothing, for ever (a write loop)
        term.wait_for("Airflow is up", timeout=180)
        term.pause()
    # (Airflow's processes retitle themselves over their environment: found as up's too)
    family = psutil.Process(term.proc.pid).children(recursive=True)
    term.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGHUP)
    code = term.wait(timeout=60)
    assert code == (-signal.SIGKILL if how == "SIGKILL" else 1), term.text[-3000:]
    _, alive = psutil.wait_procs(family, timeout=30)
    deadline = time.monotonic() + 30
    while processes_of_home(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [" ".join(p.cmdline()) for p in [*alive, *processes_of_home(home)]]
    assert not left, left
