"""The overlap trial on real ranks: overlapped and plain steps in turn, then rank 0's
verdict, broadcast to every rank; the parameters are those of the plain step, bit for
bit, on every backend."""

from __future__ import annotations

import pytest

from dagtrain.training import TrainConfig, run_training
from dagtrain.training.step import TRIAL_SKIP, TRIAL_STEPS

STEPS = TRIAL_SKIP + 2 * TRIAL_STEPS + 3  # the trial, its verdict, and steps after it


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
    verdicts = {line.split("rank ", 2)[-1][:1]: line for line in lines if "overlap " in line}
    assert set(verdicts) == {"0", "1"}  # every rank logged the verdict...
    kept = {"overlap kept" in line for line in verdicts.values()}
    assert len(kept) == 1  # ...and it is the same verdict
