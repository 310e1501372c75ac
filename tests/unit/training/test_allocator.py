"""A rank keeps the memory a step frees (``executor.keep_freed_memory``): the next
step's large tensors reuse the pages, where glibc's defaults give them back and fault
them in again; a process whose malloc was already chosen keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dagtrain.config import TrainConfig
from dagtrain.training.rank import allocator
from dagtrain.training.rank.allocator import keep_freed_memory, on_glibc, whose

# a "step": eight 16 MiB blocks made, written and freed, four times after a first one;
# the page faults of the four
STEPS = """
import ctypes, importlib.util, resource, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, counted alike
import numpy as np
spec = importlib.util.spec_from_file_location("allocator", sys.argv[2])  # not torch too
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
if sys.argv[1] == "keep":
    assert allocator.keep_freed_memory()
def step():
    blocks = [np.ones(4 << 20, dtype=np.float32) for _ in range(8)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if whose({k: v}) is None}
    env["NUMPY_MADVISE_HUGEPAGE"] = "0"  # numpy asks for huge pages for 4 MiB and more
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode, allocator.__file__],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not on_glibc(), reason="glibc's malloc only")
def test_a_step_reuses_the_pages_the_step_before_freed():
    # 4 steps x 128 MiB: 131,072 pages of 4 KiB each time they are faulted in
    assert faults("keep") < 2_000
    # glibc's defaults give them back each time (~131,000 faults on this machine's glibc)
    assert faults("glibc") > 60_000


def test_a_process_that_chose_its_malloc_keeps_it(monkeypatch):
    assert whose({}) is None
    assert whose({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    assert whose({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) == "GLIBC_TUNABLES"
    assert whose({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD (jemalloc)"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert keep_freed_memory() is False  # (and this process's malloc is untouched)


def test_it_is_on_unless_the_config_says_otherwise():
    cfg = TrainConfig()
    assert cfg.executor.keep_freed_memory is True
    off = TrainConfig.model_validate({"executor": {"keep_freed_memory": False}})
    assert off.executor.keep_freed_memory is False
