"""Launcher command lines: argv lists that Open MPI 5, horovodrun and torchrun accept."""

from __future__ import annotations

import os
import sys

import pytest

from dagtrain.launch import RankFailure, build_argv

MOD = ["dagtrain.training.rank", "c.json", "r.json"]


def test_mpirun_argv_with_hosts():
    argv = build_argv("mpirun", 4, MOD, hosts=["a:2", "b:2"])
    assert argv[0].endswith("mpirun") and isinstance(argv, list)
    assert argv[argv.index("-np") + 1] == "4"
    assert argv[argv.index("--host") + 1] == "a:2,b:2"
    assert "--bind-to" in argv and "none" in argv  # not Open MPI 4's -bind-to
    assert argv[argv.index(sys.executable) :] == [sys.executable, "-m", "mpi4py", "-m", *MOD]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_horovodrun_and_torchrun_argv():
    h = build_argv("horovodrun", 2, MOD, hosts=["a:1", "b:1"])
    assert h[1:3] == ["--gloo", "-np"] and h[h.index("-H") + 1] == "a:1,b:1"
    t = build_argv("torchrun", 2, MOD)
    assert t[t.index("--nproc-per-node") + 1] == "2" and t[-4:] == ["-m", *MOD]
    with pytest.raises(ValueError, match="one torchrun per host"):
        build_argv("torchrun", 2, MOD, hosts=["a:1", "b:1"])
    with pytest.raises(ValueError, match="not one of"):
        build_argv("srun", 2, MOD)


def test_rank_failure_message_names_rank_signal_and_log():
    err = RankFailure(1, None, "SIGKILL", ["loading", "step 3"])
    assert "rank 1 was killed by SIGKILL" in str(err) and "step 3" in str(err)
    assert RankFailure(0, 2, None, []).exit_code == 2
