"""A cluster on one machine: "hosts" that are network namespaces, PostgreSQL, Redis,
Airflow with the CeleryExecutor, and two Celery workers, each on a host of its own.

    root namespace (bridge 10.X.Y.1)          namespace A (10.X.Y.2)   namespace B (.3)
    PostgreSQL, Redis, api-server,            Celery worker            Celery worker
    scheduler, dag-processor, this test       hostname dt<id>a         hostname dt<id>b

Each host is a network namespace joined to a bridge by a veth pair, with a UTS
namespace of its own (its own hostname, as Open MPI needs to tell hosts apart) and a
hosts file (``/etc/netns/NAME/hosts``, which ``ip netns exec`` puts in place) that
names every host. The artifact root is shared through the filesystem, as a real
deployment shares it through NFS or the like. ``netns_rsh.py`` is the rsh agent that
reaches a host, standing in for ssh.

Everything is torn down by the fixtures' finalizers, also when a test fails: every
process the test started carries ``DAGTRAIN_MULTIHOST=<id>`` in its environment (and
passes it to its children: Airflow's task processes, mpirun, the ranks), and a last
sweep kills whatever still has it; then the namespaces, the bridge, the hosts files
and the temporary folders go. Where root, namespaces, PostgreSQL, Redis or the Celery
provider are missing, the tests are skipped, saying which and how to get it
(``make multihost-setup``).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
AGENT = Path(__file__).with_name("netns_rsh.py")
BIN = Path(sys.executable).parent
MARK = "DAGTRAIN_MULTIHOST"
SETUP = "run `make multihost-setup` (as root) to install what it needs"


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def skip_reason() -> str | None:
    """Why this machine cannot run the multi-host tests, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating network namespaces and veth pairs needs root"
    for tool in ("ip", "unshare"):
        if _which(tool) is None:
            return f"`{tool}` is not installed (iproute2, util-linux); {SETUP}"
    if _postgres_bin() is None:
        return f"PostgreSQL's server (initdb, postgres) is not installed; {SETUP}"
    if _which("redis-server") is None:
        return f"redis-server is not installed; {SETUP}"
    for module, package in (
        ("airflow.providers.celery", "apache-airflow-providers-celery"),
        ("psycopg2", "psycopg2-binary"),
        ("asyncpg", "asyncpg"),
        ("redis", "redis"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed; pip install -c constraints.txt -e '.[celery]'"
    for tool in ("mpirun", "torchrun", "airflow"):
        if not (BIN / tool).exists():
            return f"{tool} is not in {BIN}; install the project's dependencies (make setup)"
    probe = f"dagtrain-probe-{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def netns_inode(ns: str) -> int:
    return os.stat(f"/var/run/netns/{ns}").st_ino


def pids_in(ns: str) -> list[int]:
    """Every process in network namespace ``ns``."""
    ino = netns_inode(ns)
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{p}/ns/net").st_ino == ino:
                    found.append(int(p))
    return found


def kill_namespace(ns: str) -> int:
    """SIGKILL every process in ``ns``: the host dies (its namespace, address and
    link stay, as a rebooting machine's would). Returns how many were killed."""
    n = 0
    for pid in pids_in(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            n += 1
    return n


def marked(tag: str) -> list[int]:
    """The processes that carry ``DAGTRAIN_MULTIHOST=tag``: all that the test started
    and all that those started."""
    import psutil

    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and p.environ().get(MARK) == tag:
                out.append(p.pid)
    return out


def sweep(tag: str, deadline: float = 10.0) -> list[int]:
    """SIGTERM then SIGKILL every marked process; returns those that were found."""
    import psutil

    found = marked(tag)
    procs = []
    for pid in found:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=deadline)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=deadline)
    return found


@dataclass
class Host:
    netns: str
    hostname: str
    address: str


@dataclass
class Net:
    """The bridge, the hosts, and the rsh agent that reaches them. ``hosts`` run the
    Celery workers; ``spare`` hosts (C) run ranks only."""

    tag: str
    bridge: str
    root: str  # the root namespace's address on the bridge
    hosts: list[Host]
    map_file: Path
    spare: list[Host] = field(default_factory=list)

    @property
    def agent(self) -> tuple[str, ...]:
        return (sys.executable, str(AGENT), str(self.map_file))

    @property
    def every(self) -> list[Host]:
        return [*self.hosts, *self.spare]

    def entries(self, slots: int = 1) -> list[str]:
        return [f"{h.address}:{slots}" for h in self.hosts]

    def down(self, *hosts: Host) -> None:
        """The rsh agent no longer reaches ``hosts`` (it exits 255, as ssh does for a
        host that does not answer); ``up`` reaches them again."""
        self._reach([h for h in self.every if h not in hosts and h.address in self._map()])

    def up(self, *hosts: Host) -> None:
        known = set(self._map())
        self._reach([h for h in self.every if h.address in known or h in hosts])

    def _map(self) -> dict:
        return json.loads(self.map_file.read_text())

    def _reach(self, hosts: list[Host]) -> None:
        tmp = self.map_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({h.address: {"netns": h.netns, "hostname": h.hostname} for h in hosts})
        )
        os.replace(tmp, self.map_file)  # the agent reads one map or the other, whole


def _subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.231.0.0/16 that no interface of this machine uses."""
    used = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    taken = set()
    for word in used.split():
        with contextlib.suppress(ValueError):
            if "/" in word:
                taken.add(ipaddress.ip_interface(word).network)
    for _ in range(100):
        net = ipaddress.ip_network(f"10.231.{random.randint(1, 254)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free 10.231.x.0/24 subnet on this machine")


@pytest.fixture(scope="package")
def tag() -> str:
    reason = skip_reason()
    if reason:
        pytest.skip(f"multi-host tests skipped: {reason}")
    return secrets.token_hex(2)


@pytest.fixture(scope="package")
def workdir(tag: str) -> Iterator[Path]:
    """The test's folder (Airflow's home, the artifacts, the logs): removed at the end,
    whatever happened (assertion messages carry the logs' last lines)."""
    d = Path(tempfile.mkdtemp(prefix=f"dagtrain-multihost-{tag}-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _mkdir(parent: Path, name: str) -> Path:
    (parent / name).mkdir()
    return parent / name


@pytest.fixture(scope="package")
def net(tag: str, workdir: Path) -> Iterator[Net]:
    """Three hosts (namespaces A, B and the spare C) on a bridge with the root
    namespace."""
    sub = _subnet()
    addr = [str(a) for a in list(sub.hosts())[:4]]
    bridge = f"dtbr{tag}"
    every = [Host(f"dagtrain-{tag}-{x}", f"dt{tag}{x}", addr[i + 1]) for i, x in enumerate("abc")]
    hosts = every
    made: list[tuple[str, str]] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made.append(("link", bridge))
        _ip("addr", "add", f"{addr[0]}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        names = f"127.0.0.1 localhost\n{addr[0]} dt{tag}root\n" + "".join(
            f"{h.address} {h.hostname}\n" for h in hosts
        )
        for i, h in enumerate(hosts):
            _ip("netns", "add", h.netns)
            made.append(("netns", h.netns))
            veth = f"dt{tag}v{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            made.append(("link", veth))
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            _ip("-n", h.netns, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            made.append(("etc", str(etc)))
            (etc / "hosts").write_text(names)
        map_file = _mkdir(workdir, "net") / "hosts.json"
        map_file.write_text(
            json.dumps({h.address: {"netns": h.netns, "hostname": h.hostname} for h in hosts})
        )
        yield Net(tag, bridge, addr[0], every[:2], map_file, spare=every[2:])
    finally:
        sweep(tag)
        for kind, name in reversed(made):
            if kind == "netns":
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    kill_namespace(name)
                subprocess.run(
                    ["ip", "netns", "delete", name], capture_output=True, timeout=30, check=False
                )
            elif kind == "link":
                subprocess.run(
                    ["ip", "link", "delete", name], capture_output=True, timeout=30, check=False
                )
            else:
                shutil.rmtree(name, ignore_errors=True)


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def wait_for(what: str, test, timeout: float, every: float = 0.2, log: Path | None = None):
    """Poll ``test()`` until it returns something true; its value. TimeoutError, with
    the tail of ``log``, after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            value = test()
            if value:
                return value
        if time.monotonic() > deadline:
            tail = tail_of(log) if log else ""
            raise TimeoutError(f"{what}: not within {timeout:g} s{tail}")
        time.sleep(every)


def tail_of(log: Path, n: int = 40) -> str:
    with contextlib.suppress(OSError):
        lines = log.read_text(errors="replace").splitlines()[-n:]
        return f"\n--- last lines of {log}:\n" + "\n".join(lines)
    return ""


@dataclass
class Service:
    """A process the test started: its own session, its output in a log file."""

    name: str
    proc: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 15.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def start(name: str, argv: list[str], env: dict[str, str], logs: Path, **kw) -> Service:
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,
        )
    return Service(name, proc, log)


@pytest.fixture(scope="package")
def postgres(net: Net, workdir: Path) -> Iterator[str]:
    """A private PostgreSQL server on the bridge; yields the URL of database airflow."""
    import psycopg2

    pg = _postgres_bin()
    base = Path(tempfile.mkdtemp(prefix="dagtrain-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    shutil.chown(base, "postgres")
    shutil.chown(sock, "postgres")
    logs = _mkdir(workdir, "pg")
    service = None
    try:
        subprocess.run(
            [str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"],
            user="postgres",
            check=True,
            capture_output=True,
            timeout=120,
            cwd=base,
        )
        # trust the bridge's hosts too (initdb -A trust covers only the loopback)
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {net.root}/24 trust\n")
        port = free_port(net.root)
        service = start(
            "postgres",
            [
                str(pg / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-k",
                str(sock),
                "-c",
                f"listen_addresses={net.root}",
                "-c",
                "fsync=off",  # a test database: speed over durability
                "-c",
                "max_connections=300",
            ],
            {**os.environ, MARK: net.tag},
            logs,
            user="postgres",
            cwd=base,
        )

        def ready() -> bool:
            psycopg2.connect(host=net.root, port=port, user="postgres", dbname="postgres").close()
            return True

        wait_for("PostgreSQL accepting connections", ready, 60, log=service.log)
        conn = psycopg2.connect(host=net.root, port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:  # the one statement: a database for Airflow to own
            cur.execute("CREATE DATABASE airflow")
        conn.close()
        # psycopg2 named: SQLAlchemy 2.1 would otherwise pick psycopg (3)
        yield f"postgresql+psycopg2://postgres@{net.root}:{port}/airflow"
    finally:
        if service is not None:
            service.stop(signal.SIGINT)  # PostgreSQL's fast shutdown
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="package")
def redis(net: Net, workdir: Path) -> Iterator[str]:
    """A private Redis on the bridge (no persistence); yields the broker URL."""
    port = free_port(net.root)
    logs = _mkdir(workdir, "redis")
    service = start(
        "redis",
        [
            _which("redis-server"),
            "--port",
            str(port),
            "--bind",
            net.root,
            "--save",
            "",
            "--appendonly",
            "no",
            # no password on a private bridge; protected mode would refuse the hosts
            "--protected-mode",
            "no",
            "--dir",
            str(logs),
        ],
        {**os.environ, MARK: net.tag},
        logs,
    )
    try:

        def ready() -> bool:
            with socket.create_connection((net.root, port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        wait_for("Redis answering PING", ready, 30, log=service.log)
        yield f"redis://{net.root}:{port}/0"
    finally:
        service.stop()


@dataclass
class Cluster:
    """Airflow on PostgreSQL with Celery workers on the namespace hosts."""

    net: Net
    home: Path
    dags: Path
    artifacts: Path
    env: dict[str, str]
    url: str
    password: str
    services: list[Service] = field(default_factory=list)
    workers: dict[str, Service] = field(default_factory=dict)  # netns -> its worker

    def start_worker(self, host: Host) -> Service:
        """A Celery worker inside ``host``'s namespaces, named by its hostname."""
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--"]
        argv += [sys.executable, str(AGENT), "--enter", host.hostname]
        argv += [str(BIN / "airflow"), "celery", "worker", "--concurrency", "1"]
        argv += ["--celery-hostname", host.hostname, "--skip-serve-logs"]
        argv += ["--without-mingle", "--without-gossip"]
        w = start(f"worker-{host.hostname}", argv, self.env, self.home / "logs")
        self.workers[host.netns] = w
        return w

    def ensure_workers(self) -> None:
        for h in self.net.hosts:
            w = self.workers.get(h.netns)
            if w is None or not w.alive():
                if w is not None:
                    w.stop()
                self.start_worker(h)

    def client(self):
        from dagtrain.cli.rest import Client

        c = Client(self.url, "admin", self.password, timeout=30)
        c.login()
        return c

    def train_tries(self, client, dag_id: str, run_id: str) -> dict[int, str]:
        """The state of each try of the run's ``train`` task, by try number."""
        tries = client._send(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train/tries"
        ).json()["task_instances"]
        return {t["try_number"]: t["state"] for t in tries}

    def logs(self) -> str:
        return "".join(tail_of(s.log, 25) for s in [*self.services, *self.workers.values()])


# the example pipeline as a test runs it: its DAG file as it is, its config with the
# fields only a file may set pointed at this cluster
PIPELINE = "digits_retraining"


def pipeline_yaml(artifacts: Path, conn_id: str) -> str:
    import yaml

    cfg = yaml.safe_load((ROOT / "dags" / f"{PIPELINE}.yaml").read_text())
    cfg["artifacts"] = {"root": str(artifacts)}
    cfg["distributed"]["hosts_connection"] = conn_id
    # retries resume from checkpoints: checkpoint often, retry at once
    cfg["training"].update({"retries": 2, "retry_delay_seconds": 1, "checkpoint_every": 10})
    cfg["distributed"]["collective_timeout"] = 20
    cfg["schedule"] = {"cron": None}  # runs by trigger only: no scheduled run beside ours
    return yaml.safe_dump(cfg, sort_keys=False)


CONN_ID = "dagtrain_lab_hosts"

# the elastic pipeline: the same DAG file, 3 ranks on hosts A, B and the spare C, going
# on with 2; its steps slowed so that a host can die and come back mid-run
ELASTIC = "digits_elastic"
ELASTIC_CONN = "dagtrain_lab_hosts3"


def elastic_yaml(artifacts: Path) -> str:
    import yaml

    cfg = yaml.safe_load(pipeline_yaml(artifacts, ELASTIC_CONN))
    cfg["name"] = ELASTIC
    cfg["model"] = {"name": "tests.unit.training.factory:slow", "args": {"seconds": 0.03}}
    cfg["training"].update(
        {"epochs": 14, "batch_size": 30, "checkpoint_every": 0, "retry_delay_seconds": 20}
    )
    cfg["distributed"].update({"ranks": 3, "min_ranks": 2})
    cfg["evaluation"]["threshold"] = 0.0
    return yaml.safe_dump(cfg, sort_keys=False)


@pytest.fixture(scope="package")
def cluster(net: Net, postgres: str, redis: str, workdir: Path) -> Iterator[Cluster]:
    """Airflow 3 with the CeleryExecutor: migrate the database, start the api-server,
    scheduler and dag-processor here, a Celery worker in each host."""
    home = _mkdir(workdir, "airflow")
    dags, logs, artifacts = home / "dags", home / "logs", home / "artifacts"
    for d in (dags, logs, artifacts):
        d.mkdir()
    shutil.copy(ROOT / "dags" / f"{PIPELINE}.py", dags)
    (dags / f"{PIPELINE}.yaml").write_text(pipeline_yaml(artifacts, CONN_ID))
    shutil.copy(ROOT / "dags" / f"{PIPELINE}.py", dags / f"{ELASTIC}.py")
    (dags / f"{ELASTIC}.yaml").write_text(elastic_yaml(artifacts))
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    port = free_port(net.root)
    url = f"http://{net.root}:{port}"
    env = {
        **os.environ,
        MARK: net.tag,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres,
        "AIRFLOW__CELERY__BROKER_URL": redis,
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{postgres}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(24),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(24),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(logs / "tasks"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "300",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
        "OMP_NUM_THREADS": "1",
    }
    c = Cluster(net, home, dags, artifacts, env, url, password)
    airflow = str(BIN / "airflow")
    try:
        migrate = subprocess.run(
            [airflow, "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        c.services.append(
            start(
                "api-server",
                [airflow, "api-server", "--host", net.root, "--port", str(port), "-w", "1"],
                env,
                logs,
            )
        )
        c.services.append(start("scheduler", [airflow, "scheduler"], env, logs))
        c.services.append(start("dag-processor", [airflow, "dag-processor"], env, logs))
        c.ensure_workers()
        import httpx

        wait_for(
            "the api-server answering",
            lambda: httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200,
            180,
            every=1,
            log=c.services[0].log,
        )
        client = c.client()
        # the hosts of the ranks: a Connection, through the REST API like any other
        extra = {
            "hosts": net.entries(1),
            "rsh_agent": list(net.agent),
            "env": {"GLOO_SOCKET_IFNAME": "eth0"},
            "rdzv_port": 29400 + random.randint(1, 500),
        }
        r = client._send(
            "POST",
            "/api/v2/connections",
            json={"connection_id": CONN_ID, "conn_type": "generic", "extra": json.dumps(extra)},
        )
        assert r.status_code in (200, 201), r.text
        three = {**extra, "hosts": [f"{h.address}:1" for h in net.every]}
        r = client._send(
            "POST",
            "/api/v2/connections",
            json={
                "connection_id": ELASTIC_CONN,
                "conn_type": "generic",
                "extra": json.dumps(three),
            },
        )
        assert r.status_code in (200, 201), r.text
        wait_for(
            "the DAGs parsed",
            lambda: all(
                client._send("GET", f"/api/v2/dags/{d}").status_code == 200
                for d in ("dagtrain_digits", f"dagtrain_{ELASTIC}")
            ),
            180,
            every=1,
            log=c.services[2].log,
        )
        yield c
    finally:
        for w in c.workers.values():
            w.stop()
        for s in reversed(c.services):
            s.stop()
        sweep(net.tag)
