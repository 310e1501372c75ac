"""Virtual environments the tests build (the e2e install, the MLflow server's): with uv
where the project's venv has it (``make setup`` installs it: seconds where pip takes a
minute or more), else with pip. uv does not read pip's configuration, so pip's
find-links and index on this machine are handed to it, as ``make setup`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UV = Path(sys.executable).parent / "uv"


def _pip_setting(variable: str, key: str) -> list[str]:
    values = os.environ.get(variable, "").split()
    if values:
        return values
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", key],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return got.stdout.split() if got.returncode == 0 else []


def uv_from() -> list[str]:
    """pip's find-links and index of this machine, as uv's options (``make setup``'s)."""
    links = _pip_setting("PIP_FIND_LINKS", "global.find-links")
    index = _pip_setting("PIP_INDEX_URL", "global.index-url")
    return [
        *(x for v in links for x in ("--find-links", v)),
        *(x for v in index[:1] for x in ("--index-url", v)),
    ]


def build(venv: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """A new venv at ``venv`` with ``pip install ARGS`` done in it (check the result's
    returncode; its stderr says why it failed)."""
    if not UV.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        argv = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        argv += ["--disable-pip-version-check", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    return subprocess.run(
        [str(UV), "pip", "install", "--quiet", *uv_from(), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip
