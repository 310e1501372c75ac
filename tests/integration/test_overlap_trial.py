"""The overlap trial on real ranks: overlapped and plain steps in turn, then rank 0's
verdict, broadcast to every rank, and its reviews (a probe of the other kind, a
broadcast every REVIEW_EVERY steps); the parameters are those of the plain step, bit
for bit, on every backend."""

from __future__ import annotations

import re

import pytest

from dagtrain.training import TrainConfig, run_training
from dagtrain.training.rank.overlap import PLAIN_RUN, REVIEW_EVERY, TRIAL_SKIP, TRIAL_STEPS

# the trial, its verdict, a block that ends with a probe, a review, another block
STEPS = TRIAL_SKIP + (PLAIN_RUN + 1) * TRIAL_STEPS + 2 * REVIEW_EVERY + 1


@pytest.mark.parametrize("backend", ["mpi", "torch", "horovod"])
def test_the_trial_and_its_verdict_give_the_plain_steps_parameters(backend):
    kw = {
        "backend": backend,
        "epochs": 1,
        "max_steps": STEPS,
        "batch_size": 32,
        "bucket_mb": 0.002,  # 2 buckets: the output layer and a bias, the first weight
        "model_args": {"hidden": [32]},
        "collective_timeout": 60,
    }
    lines: list[str] = []
    on = run_training(TrainConfig(overlap=True, **kw), 2, on_line=lines.append)
    off = run_training(TrainConfig(overlap=False, **kw), 2, on_line=lambda line: None)
    assert on.steps == off.steps == STEPS and len(on.bucket_bytes) == 2
    assert on.params_sha256 == off.params_sha256
    verdicts: dict[str, list[str]] = {}
    for line in lines:
        if "overlap " in line:
            verdicts.setdefault(line.split("rank ", 2)[-1][:1], []).append(line)
    assert set(verdicts) == {"0", "1"}  # every rank logged the verdicts...
    kept = [
        [("overlap kept" in v, re.search(r"step \d+", v)[0]) for v in vs]
        for vs in verdicts.values()
    ]
    assert kept[0] == kept[1]  # ...the same ones, at the same steps
