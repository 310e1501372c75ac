"""mpirun's session directory lives in a directory of the job's own.

Open MPI names it by mpirun's pid (``ompi.<pid>`` under TMPDIR) and removes it when it
exits; one that a SIGKILLed mpirun left in /tmp stopped the next mpirun given that pid
from starting ("The PMIx server's listener thread failed to start", exit 213: seen in
a test run, and reproduced by planting one for the next pid).
"""

from __future__ import annotations

import json
from pathlib import Path

from dagtrain.launch import launch


def test_mpirun_keeps_its_session_directory_in_one_of_the_jobs_own():
    lines: list[str] = []
    launch(["tests.unit.launch.show_tmpdir"], 1, "mpirun", on_line=lines.append, timeout=120)
    shown = [json.loads(x.split("TMPDIR ", 1)[1]) for x in lines if "TMPDIR [" in x]
    assert len(shown) == 1, lines
    tmpdir, entries = shown[0]
    assert Path(tmpdir).name.startswith("dagtrain-mpirun-"), tmpdir
    assert any(e.startswith("ompi.") for e in entries), entries  # Open MPI's is in it
    assert not Path(tmpdir).exists()  # removed with the job
