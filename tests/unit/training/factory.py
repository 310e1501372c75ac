"""A user model factory, imported by path in the tests."""

import torch
from torch import nn


def tiny(in_shape, classes, width=8):
    import math

    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.ReLU(), nn.Linear(width, classes)
    )


class _NaNModel(nn.Module):
    def __init__(self, n, classes):
        super().__init__()
        self.lin = nn.Linear(n, classes)

    def forward(self, x):
        import torch

        return self.lin(x) * torch.sqrt(torch.tensor(-1.0))  # NaN from the first step


def nan(in_shape, classes):
    import math

    return _NaNModel(math.prod(in_shape), classes)


class _Slow(nn.Module):
    def __init__(self, n, classes, seconds):
        super().__init__()
        self.lin = nn.Linear(n, classes)
        self.seconds = seconds

    def forward(self, x):
        import time

        time.sleep(self.seconds)
        return self.lin(x.reshape(x.shape[0], -1))


def slow(in_shape, classes, seconds=0.02):
    """A model whose steps take long enough for a test to kill a rank mid-run."""
    import math

    return _Slow(math.prod(in_shape), classes, seconds)


def slow_to_stop(in_shape, classes, seconds=0.02):
    """``slow``, in a rank that ignores SIGTERM: stopping it takes its launcher's grace
    (seconds), long enough for a second Ctrl-C to land while the run stops."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return slow(in_shape, classes, seconds)


def fail_on_rank1(in_shape, classes):

    from dagtrain.rank_env import env_rank

    if env_rank() == "1":
        raise RuntimeError("rank 1 cannot build its model")
    return tiny(in_shape, classes)


class _Hang(nn.Module):
    def __init__(self, n, classes):
        super().__init__()
        self.lin = nn.Linear(n, classes)
        self.calls = 0

    def forward(self, x):
        import time

        self.calls += 1
        from dagtrain.rank_env import env_rank

        if env_rank() == "1" and self.calls == 3:
            time.sleep(3600)  # alive but gone: the others must not wait forever
        return self.lin(x.reshape(x.shape[0], -1))


def hang_on_rank1(in_shape, classes):
    import math

    return _Hang(math.prod(in_shape), classes)


class _FailOnce(nn.Module):
    def __init__(self, n, classes, marker, at_call):
        super().__init__()
        self.lin = nn.Linear(n, classes)
        self.marker, self.at_call, self.calls = marker, at_call, 0

    def forward(self, x):
        import os

        from dagtrain.rank_env import env_rank

        self.calls += 1
        if env_rank() == "1" and self.calls == self.at_call and not os.path.exists(self.marker):
            open(self.marker, "w").close()  # the next try (a retry) passes
            raise RuntimeError("injected fault: rank 1 fails once")
        return self.lin(x.reshape(x.shape[0], -1))


def fail_once(in_shape, classes, marker, at_call):
    """Rank 1 raises in its ``at_call``-th forward, the first time only (a marker file)."""
    import math

    return _FailOnce(math.prod(in_shape), classes, marker, at_call)


def hang_before_first_collective(in_shape, classes):
    """Rank 1 never gets past building its model (as if SIGSTOPped before any collective)."""
    import time

    from dagtrain.rank_env import env_rank

    if env_rank() == "1":
        time.sleep(3600)
    return tiny(in_shape, classes)


def slow_to_evaluate(in_shape, classes, seconds=60.0):
    """``tiny``, but building it takes ``seconds`` in the evaluate task's process (Airflow
    names the task running in AIRFLOW_CTX_TASK_ID): a test can interrupt evaluation."""
    import os
    import time

    if os.environ.get("AIRFLOW_CTX_TASK_ID") == "evaluate":
        time.sleep(seconds)
    return tiny(in_shape, classes)


class _FailAtStep(nn.Module):
    def __init__(self, n, classes, rank, step, how):
        super().__init__()
        self.lin = nn.Linear(n, classes)
        self.rank, self.step, self.how, self.calls = str(rank), step, how, 0

    def forward(self, x):
        import os
        import signal

        from dagtrain.errors import InputError
        from dagtrain.rank_env import env_rank

        self.calls += 1  # one forward a step: call k + 1 is step k
        if env_rank() == self.rank and self.calls == self.step + 1:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)  # no record: nothing runs after it
            raise InputError(f"rank {self.rank} met a bad batch at step {self.step}")
        return self.lin(x.reshape(x.shape[0], -1))


def fail_at_step(in_shape, classes, rank=1, step=3, how="raise"):
    """Rank ``rank`` fails in step ``step`` (counted from 0, so after ``step`` steps):
    ``how`` ``raise`` raises an InputError (a project error), ``sigkill`` kills itself
    with SIGKILL."""
    import math

    return _FailAtStep(math.prod(in_shape), classes, rank, step, how)


class _Sleep(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        import time

        time.sleep(self.seconds)
        return x


def slow_blocks(in_shape, classes, seconds=0.005, width=16):
    """Blocks in sequence (a list: a pipeline can split it), each step slow enough for a
    test to kill a stage's rank mid-run."""
    import math

    return [
        nn.Flatten(),
        nn.Linear(math.prod(in_shape), width),
        _Sleep(seconds),
        nn.ReLU(),
        nn.Linear(width, width),
        _Sleep(seconds),
        nn.ReLU(),
        nn.Linear(width, classes),
    ]


def flat_in(in_shape, classes, features=10):
    """A model for samples of ``features`` values, whatever the data's shape."""
    return nn.Linear(features, classes)


def outputs(in_shape, classes, n=3):
    """A model giving ``n`` values a sample, whatever the classes."""
    import math

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), n))


def wide(in_shape, classes, width=2048):
    """Larger than the preflight's CPU forward (over 4M parameters): checked on meta."""
    import math

    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.Linear(width, width),
        nn.Linear(width, classes),
    )  # fmt: skip


def loss_only():
    """A DAG author's objective reporting its loss alone (cross-entropy of classes)."""
    import torch

    from dagtrain.training.rank.objective import Objective

    class LossOnly(Objective):
        metrics = {"loss": "min"}  # noqa: RUF012

        def loss(self, output, target):
            return torch.nn.functional.cross_entropy(output, target, reduction="sum")

        def compute(self, sums):
            return {"loss": sums["loss"] / sums["units"]}

    return LossOnly()


class _NanWeightGrad(torch.autograd.Function):
    """``x`` unchanged; backward: ``x``'s gradient as it comes, ``w``'s NaN."""

    @staticmethod
    def forward(ctx, x, w):
        return x + 0 * w

    @staticmethod
    def backward(ctx, g):
        return g, torch.full((1,), float("nan"))


class _NanWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return _NanWeightGrad.apply(x, self.w)


def nan_last_weight(in_shape, classes):
    """Five blocks for a pipeline: the last one's weight gets a NaN gradient every step,
    every other gradient (its input's included) stays finite, so only the stage that
    holds it sees a non-finite gradient."""
    import math

    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), 8), nn.ReLU(), nn.Linear(8, classes),
        _NanWeight(),
    )  # fmt: skip
