"""Ranks across hosts, without the hosts: the host list, the Connection's extra, the
argv each launcher gets, the remote end of a torchrun node, and how a lost host is
named. The real thing runs in tests/multihost/."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from dagtrain.config import PipelineConfig, load_config, merge_conf
from dagtrain.errors import InputError
from dagtrain.launch import Hosts, RankFailure, build_argv, from_extra, node_argvs
from dagtrain.launch.diagnose import diagnose
from dagtrain.launch.supervise import Ending, Job, reader

MOD = ["dagtrain.training.rank", "c.json", "r.json"]
AGENT = ("/opt/agent", "--map", "/etc/map.json")


def test_a_host_list_has_names_slots_and_a_placement_by_slot():
    h = Hosts(("10.0.0.2:2", "b", "[fd00::3]:1"))
    assert h.names == ["10.0.0.2", "b", "[fd00::3]"]
    assert h.slots == [2, 1, 1]
    assert h.placement(4) == ["10.0.0.2", "10.0.0.2", "b", "[fd00::3]"]
    assert h.agent() == ["ssh"]  # Open MPI's default too
    assert Hosts.of(["a:1"]) == Hosts(("a:1",)) and Hosts.of([]) is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"entries": ()}, "the host list is empty"),
        ({"entries": ("a:0",)}, "[0]: 'a:0' is not 'host:slots'"),
        ({"entries": ("a:1", "b c:1")}, "[1]: 'b c:1'"),
        # an ssh option in the place of a host, from whoever edits the connection
        ({"entries": ("a:1", "-oProxyCommand=touch /tmp/x:1")}, "[1]: '-oProxyCommand="),
        ({"entries": ("a:1",), "rsh_agent": ("my agent",)}, "rsh_agent[0]"),
        ({"entries": ("a:1",), "env": {"1BAD": "x"}}, "env: '1BAD'"),
        ({"entries": ("a:1",), "rdzv_port": 70000}, "rdzv_port: 70000"),
    ],
)
def test_a_bad_host_list_is_refused_naming_the_field(kw, needle):
    with pytest.raises(InputError) as info:
        Hosts(**{"entries": ("a:1",), **kw})
    assert needle in str(info.value), str(info.value)


def test_the_connection_extra_becomes_hosts():
    extra = {
        "hosts": ["10.0.0.2:1", "10.0.0.3:1"],
        "rsh_agent": ["ssh", "-p", "2222"],
        "env": {"GLOO_SOCKET_IFNAME": "eth0"},
        "rdzv_port": 29500,
    }
    h = from_extra("gpu_hosts", json.dumps(extra))
    assert h.entries == ("10.0.0.2:1", "10.0.0.3:1")
    assert h.rsh_agent == ("ssh", "-p", "2222") and h.rdzv_port == 29500
    assert h.env == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert from_extra("x", {"hosts": ["a:1"]}).rdzv_port == 29400


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("", "extra.hosts must be a non-empty list"),
        ("{not json", "its extra is not valid JSON"),
        ("[1, 2]", "its extra is not a JSON object"),
        ({"hosts": "a:1,b:1"}, "extra.hosts must be a non-empty list"),
        ({"hosts": ["a:1"], "rsh_agnet": ["ssh"]}, "unknown key(s) 'rsh_agnet'"),
        ({"hosts": ["a:1"], "rsh_agent": "ssh -p 22"}, "extra.rsh_agent must be a list"),
        ({"hosts": ["a:1"], "env": ["X=1"]}, "extra.env must be an object"),
        ({"hosts": ["a:1"], "rdzv_port": "29400"}, "extra.rdzv_port: '29400'"),
        ({"hosts": ["a:x"]}, "extra.hosts[0]: 'a:x'"),
    ],
)
def test_a_bad_extra_names_the_connection_and_the_key(extra, needle):
    with pytest.raises(InputError) as info:
        from_extra("hosts_a", extra)
    msg = str(info.value)
    assert "Airflow connection 'hosts_a'" in msg and needle in msg, msg


def test_hosts_connection_is_for_config_files_only(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("distributed: {hosts_connection: lab_hosts}\n")
    cfg = load_config(f)
    assert cfg.distributed.hosts_connection == "lab_hosts"
    assert merge_conf(cfg, {"distributed": {"hosts_connection": "lab_hosts"}})
    with pytest.raises(InputError, match=r"distributed\.hosts_connection"):
        merge_conf(cfg, {"distributed": {"hosts_connection": "attacker_hosts"}})
    with pytest.raises(ValueError, match="both set"):
        PipelineConfig.model_validate(
            {"distributed": {"hosts": ["a:1"], "hosts_connection": "lab_hosts"}}
        )


def test_mpirun_gets_the_rsh_agent_as_one_mca_value_and_the_hosts_env():
    h = Hosts(("a:1", "b:1"), AGENT, {"GLOO_SOCKET_IFNAME": "eth0"})
    argv = build_argv("mpirun", 2, MOD, h, env={"X": "1"})
    i = argv.index("plm_rsh_agent")
    assert argv[i - 1] == "--mca" and argv[i + 1] == " ".join(AGENT)
    assert argv[argv.index("--host") + 1] == "a:1,b:1"
    xs = [argv[k + 1] for k, w in enumerate(argv) if w == "-x"]
    # names only: mpirun exports their values from its own environment, where the
    # launcher puts them; a value (a token, a password) on a command line is readable
    # in /proc/*/cmdline by every user of every host
    assert "GLOO_SOCKET_IFNAME" in xs and "X" in xs
    assert not any("=" in x for x in xs) and "eth0" not in argv
    # without an agent, Open MPI's own default (ssh) is left alone
    assert "plm_rsh_agent" not in build_argv("mpirun", 2, MOD, ["a:1", "b:1"])
    with pytest.raises(InputError, match="horovodrun reaches other hosts through ssh only"):
        build_argv("horovodrun", 2, MOD, h)


def test_torchrun_is_one_node_per_host_meeting_at_the_first_hosts_rendezvous():
    h = Hosts(("10.9.0.2:2", "10.9.0.3:1"), AGENT, {"GLOO_SOCKET_IFNAME": "eth0"}, 29555)
    nodes = node_argvs(3, MOD, h, env={"X": "a b"}, rdzv_id="job7")
    assert [host for host, _, _ in nodes] == ["10.9.0.2", "10.9.0.3"]
    for k, (host, argv, remote_input) in enumerate(nodes):
        assert remote_input  # neither address is this machine's
        assert argv[: len(AGENT) + 1] == [*AGENT, host]
        # what the remote shell will read: the words come back as they were
        words = shlex.split(" ".join(argv[len(AGENT) + 1 :]))
        assert words[:4] == [sys.executable, "-m", "dagtrain.launch.remote", "--"]
        cmd = words[words.index("--") + 1 :]
        # the variables go on its input, one JSON line; no value is on a command line
        env = json.loads(remote_input)
        assert remote_input.endswith("\n") and remote_input.count("\n") == 1
        assert env["X"] == "a b" and env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[default${rank}]:"
        assert not any("a b" in w or "eth0" in w for w in argv), argv
        assert cmd[cmd.index("--nnodes") + 1] == "2"
        assert cmd[cmd.index("--nproc-per-node") + 1] == str(h.slots[k])
        assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
        assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.9.0.2:29555"
        assert cmd[cmd.index("--rdzv-id") + 1] == "job7"
        assert cmd[cmd.index("--local-addr") + 1] == host
        conf = cmd[cmd.index("--rdzv-conf") + 1]
        assert conf.startswith(f"is_host={'true' if k == 0 else 'false'},join_timeout=")
        assert cmd[-4:] == ["-m", *MOD]
    with pytest.raises(InputError, match="slots add up to 3 but the job has 4 ranks"):
        node_argvs(4, MOD, h)


def test_torchrun_on_one_other_host_is_a_remote_node_too():
    with pytest.raises(InputError, match="one torchrun per host"):
        build_argv("torchrun", 2, MOD, ["10.9.0.3:2"])
    [(host, argv, remote_input)] = node_argvs(2, MOD, Hosts(("10.9.0.3:2",), AGENT))
    assert host == "10.9.0.3"
    assert remote_input and argv[: len(AGENT) + 1] == [*AGENT, "10.9.0.3"]
    assert build_argv("torchrun", 2, MOD, ["localhost:2"])[0].endswith("torchrun")


def test_a_local_host_gets_its_torchrun_without_the_agent():
    nodes = node_argvs(2, MOD, Hosts(("127.0.0.1:1", "10.9.0.3:1"), AGENT))
    assert nodes[0][2] is None and nodes[0][1][0].endswith("torchrun")
    assert json.loads(nodes[1][2]) is not None


def test_the_direct_launcher_refuses_other_hosts():
    from dagtrain.launch import launch

    with pytest.raises(InputError, match="launcher direct starts every rank on this host"):
        launch(MOD, 2, "direct", hosts=["10.9.0.3:2"])


def _job(
    lines: list[str],
    hosts: Hosts,
    node: int | None = None,
    node_hosts=(),
    records=(),
    tmp=None,
) -> Job:
    """A Job that read ``lines`` as a launcher's output (its own lines, untagged) and
    whose ranks wrote ``records`` (status records: rank_env's fields) in ``tmp``."""
    job = Job([], direct=False, hosts=hosts, nprocs=2, node_hosts=list(node_hosts))
    job.status_dir, job.job_id = tmp, "job-1"
    for rec in records:
        (tmp / f"rank{rec['rank']}.json").write_text(json.dumps({"job": "job-1", **rec}))
    # a record of an earlier job in the same folder is not this job's
    if tmp is not None:
        (tmp / "rank7.json").write_text(json.dumps({"job": "old", "rank": 7, "host": "x"}))
    r, w = os.pipe()
    with os.fdopen(w, "w") as f:
        f.write("\n".join(lines) + "\n")
    reader(job, os.fdopen(r), None, lambda line: None, node)
    job.refresh()
    return job


def test_open_mpi_losing_a_hosts_daemon_names_the_rank_and_the_host(tmp_path):
    # what Open MPI 5 prints (and then it exits 0) when a host's daemon is gone; where
    # the ranks ran, and that rank 1 reached its first collective, their records say
    lines = [
        "[1,0]<stderr>: dagtrain rank 0 runs on host node-a",
        "[1,1]<stderr>: dagtrain rank 1 runs on host node-b",
        "[1,1]<stderr>: dagtrain rank 1 reached its first collective",
        "PRTE has lost communication with a remote daemon.",
        "  HNP daemon   : [prterun-node-a-17996@0,0] on node node-a",
        "  Remote daemon: [prterun-node-a-17996@0,1] on node node-b",
    ]
    records = [
        {"rank": 0, "host": "node-a", "status": "running", "step": 4},
        {"rank": 1, "host": "node-b", "status": "running", "step": 3, "ready": True},
    ]
    job = _job(lines, Hosts(("10.0.0.2:1", "10.0.0.3:1")), records=records, tmp=tmp_path)
    assert job.placement == {0: "node-a", 1: "node-b"} and job.lost == ["node-b"]
    assert job.ready == {1}
    err = diagnose(job, Ending([], [0]))
    assert isinstance(err, RankFailure) and (err.rank, err.host) == (1, "node-b (10.0.0.3)")
    assert str(err).startswith("rank 1 on host node-b (10.0.0.3) was lost with its host")
    assert "reached its first collective" in "\n".join(err.log_tail)
    assert err.step == 3 and err.to_dict()["host"] == "node-b (10.0.0.3)"


def test_a_torchrun_node_whose_agent_lost_its_connection_names_its_ranks_host(tmp_path):
    hosts = Hosts(("10.0.0.2:1", "10.0.0.3:1"))
    records = [{"rank": 1, "host": "node-b", "status": "running"}]
    job = _job(["[default1]:x"], hosts, 1, hosts.names, records, tmp_path)
    assert job.node_of_rank == {1: 1}
    err = diagnose(job, Ending([(1, 255)], [None, 255]))
    assert (err.rank, err.host) == (1, "node-b (10.0.0.3)")
    assert "rsh agent exited with code 255" in str(err)
    # a rank that failed by itself is named as before, with its host and its error, as
    # its record says (what it printed is only shown)
    failed = {
        "rank": 0,
        "host": "node-a",
        "status": "failed",
        "type": "ValueError",
        "message": "bad",
        "time": 1.0,
        "step": 5,
        "role": "train",
        "fail_fast": False,
    }
    job = _job(["[default0]:Traceback ..."], hosts, 0, hosts.names, [failed], tmp_path)
    err = diagnose(job, Ending([(0, 1)], [1, None]))
    assert err.rank == 0 and err.host == "node-a (10.0.0.2)" and "ValueError: bad" in str(err)
    assert (err.error_type, err.error_message, err.step, err.role) == (
        "ValueError",
        "bad",
        5,
        "train",
    )
    assert err.to_dict()["error"] == "ValueError: bad" and err.last_lines == ["Traceback ..."]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


@pytest.mark.parametrize("how", ["eof", "sigterm", "sighup"])
def test_the_remote_end_stops_its_node_when_the_connection_closes_or_hangs_up(tmp_path, how):
    pid_file = tmp_path / "child.pid"
    child = f"import os,time; open({str(pid_file)!r},'w').write(str(os.getpid())); time.sleep(60)"
    p = subprocess.Popen(
        [sys.executable, "-m", "dagtrain.launch.remote", "--", sys.executable, "-c", child],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdin.write(b'{"A": "1"}\n')
    p.stdin.flush()
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    if how == "eof":
        p.stdin.close()
    else:
        p.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGHUP)
    code = p.wait(timeout=20)
    assert code == 128 + signal.SIGTERM, code  # the node ended by SIGTERM, said as ssh would
    assert not _alive(pid)
    if how == "eof":
        assert b"the launcher's connection closed" in p.stderr.read()


def test_the_remote_end_passes_the_exit_code_and_the_environment_on():
    # its input stays open (an EOF would stop the node: the launcher's death)
    remote = [sys.executable, "-m", "dagtrain.launch.remote", "--"]
    code = "import os,sys; sys.exit(3 if os.environ['DT_X'] == 'a b' else 1)"
    p = subprocess.Popen([*remote, sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        p.stdin.write(json.dumps({"DT_X": "a b"}).encode() + b"\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 3
    finally:
        p.stdin.close()
    for args, given, say in [
        (["--env", "A=1", "--", "true"], b"{}\n", "usage"),  # no variables on its argv
        (["--", "true"], b'["A=1"]\n', "not a JSON object of strings"),
        (["--", "true"], b'{"A": 1}\n', "not a JSON object of strings"),
        (["--", "true"], b"", "stdin closed before its variables"),
    ]:
        bad = subprocess.run(
            [sys.executable, "-m", "dagtrain.launch.remote", *args],
            input=given, capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert bad.returncode != 0 and say in bad.stderr.decode(), (args, bad.stderr)


def test_the_training_stage_reads_the_connection_through_airflow(monkeypatch):
    from dagtrain.phases.train import connection_hosts, resolve_hosts

    extra = {"hosts": ["10.0.0.2:1", "10.0.0.3:1"], "rsh_agent": ["ssh", "-p", "2222"]}
    # an AIRFLOW_CONN_ variable is one of the places Airflow's API reads connections from
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAB_HOSTS", json.dumps({"conn_type": "generic", "extra": extra})
    )
    h = connection_hosts("lab_hosts")
    assert h.entries == ("10.0.0.2:1", "10.0.0.3:1") and h.rsh_agent == ("ssh", "-p", "2222")
    cfg = PipelineConfig.model_validate({"distributed": {"hosts_connection": "lab_hosts"}})
    assert resolve_hosts(cfg.distributed) == h
    plain = PipelineConfig.model_validate({"distributed": {"hosts": ["a:2"]}})
    assert resolve_hosts(plain.distributed) == ["a:2"]
    assert resolve_hosts(PipelineConfig().distributed) is None


@pytest.mark.parametrize(
    ("conn", "needle"),
    [
        (None, "there is no Airflow connection 'lab_hosts'; create it"),
        ({"conn_type": "generic", "extra": {"hosts": []}}, "extra.hosts must be a non-empty"),
        ({"conn_type": "generic", "host": "10.0.0.2"}, "extra.hosts must be a non-empty"),
    ],
)
def test_a_missing_or_bad_connection_fails_the_stage_before_any_rank_starts(
    tmp_path, monkeypatch, conn, needle
):
    import dagtrain.training
    from dagtrain.config import TrainConfig
    from dagtrain.phases.train import run_train
    from dagtrain.records.layout import TrainFiles

    monkeypatch.delenv("AIRFLOW_CONN_LAB_HOSTS", raising=False)
    if conn is not None:
        monkeypatch.setenv("AIRFLOW_CONN_LAB_HOSTS", json.dumps(conn))
    started = []
    monkeypatch.setattr(dagtrain.training, "run_training", lambda *a, **k: started.append(a))
    tcfg = TrainConfig(backend="mpi", hosts_connection="lab_hosts")
    with pytest.raises(InputError) as info:
        run_train(tcfg, TrainFiles(tmp_path))
    assert needle in str(info.value), str(info.value)
    assert not started and not list(tmp_path.iterdir())
