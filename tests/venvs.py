"""Virtual environments the tests build (the e2e install, the MLflow server's): with uv
where the project's venv has it (``make setup`` installs it: seconds where pip takes a
minute or more), else with pip. uv does not read pip's configuration, so pip's
find-links on this machine are handed to it, as ``make setup`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UV = Path(sys.executable).parent / "uv"


def pip_find_links() -> list[str]:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if links:
        return links
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return got.stdout.split() if got.returncode == 0 else []


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
    links = [x for link in pip_find_links() for x in ("--find-links", link)]
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    return subprocess.run(
        [str(UV), "pip", "install", "--quiet", *links, *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip
