"""The executor's examples in README.md and docs/taskgraph.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def readme_block() -> str:
    """The first python block after the heading "## The executor in ten lines"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    heading = "\n## The executor in ten lines\n"
    assert heading in text, "README.md lost its section 'The executor in ten lines'"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert blocks, "no python block in README.md's 'The executor in ten lines'"
    return blocks[0]


def run(code: str, where: str) -> dict:
    namespace: dict = {"__name__": "__example__"}
    exec(compile(code, where, "exec"), namespace)
    return namespace


def test_the_executor_in_ten_lines_runs(tmp_path, monkeypatch, capsys):
    code = readme_block()
    assert len(code.strip().splitlines()) <= 20, "the ten lines grew past twenty"
    monkeypatch.chdir(tmp_path)
    ns = run(code, "README.md: The executor in ten lines")
    assert (tmp_path / "step.json").stat().st_size > 0  # the trace
    assert ns["report"].makespan > 0
    assert "busy" in capsys.readouterr().out  # it prints makespan and utilisation


DOC_BLOCKS = python_blocks((ROOT / "docs" / "taskgraph.md").read_text(encoding="utf-8"))


def test_docs_have_examples():
    assert len(DOC_BLOCKS) >= 6


@pytest.mark.parametrize("k", range(len(DOC_BLOCKS)))
def test_every_docs_example_runs(k, tmp_path, monkeypatch):
    """Each python block of docs/taskgraph.md is complete: it runs on its own."""
    monkeypatch.chdir(tmp_path)
    run(DOC_BLOCKS[k], f"docs/taskgraph.md, python block {k + 1}")
