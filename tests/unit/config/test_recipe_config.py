"""The recipe's refusals that need no data, each naming its field and what to do."""

from __future__ import annotations

import pytest

from dagtrain.config import PipelineConfig
from dagtrain.config.files import validate
from dagtrain.config.schema import ConfigError


@pytest.mark.parametrize(
    ("training", "extra", "needle"),
    [
        ({"max_grad_norm": 0}, {}, "training.max_grad_norm"),
        ({"max_grad_norm": -1.0}, {}, "training.max_grad_norm"),
        ({"precision": "fp16"}, {}, "training.precision fp16 needs a GPU"),
        (
            {"precision": "fp16"},
            {"distributed": {"device": "cuda", "backend": "torch", "ranks": 2},
             "parallel": {"stages": 2, "microbatches": 2}},
            "a pipeline trains in fp32 or bf16",
        ),
        ({"accumulation_steps": 3, "batch_size": 64}, {}, "a multiple of 3 x ranks (e.g. 66)"),
        (
            {"accumulation_steps": 2, "batch_size": 64},
            {"distributed": {"backend": "torch", "ranks": 2},
             "parallel": {"stages": 2, "microbatches": 2}},
            "raise parallel.microbatches instead (e.g. 4)",
        ),
        (
            {"accumulation_steps": 2, "batch_size": 30},
            {"distributed": {"ranks": 3, "min_ranks": 2}},
            "on 2 rank(s): make batch_size a multiple of 2 x ranks (e.g. 36)",
        ),
        ({"warmup_steps": 5, "warmup_ratio": 0.1}, {}, "give one of them"),
        ({"warmup_steps": 8, "max_steps": 8}, {}, "not shorter than the run"),
        ({"early_stopping": {"metric": "mse"}}, {}, "not report it; it reports accuracy, loss"),
        ({"early_stopping": {"patience": 0}}, {}, "training.early_stopping.patience"),
        ({"lr_schedule": "step"}, {}, "training.lr_schedule"),
        ({"early_stopping": {}}, {"pipeline": "rounds"}, "the rounds decide when it ends"),
        ({"warmup_steps": 20}, {"pipeline": "rounds"}, "rounds.local_steps 20 a round"),
        ({"lr_schedule": "cosin"}, {}, "training.lr_schedule"),
    ],
)  # fmt: skip
def test_a_recipe_that_cannot_run_is_refused_naming_the_field(training, extra, needle):
    with pytest.raises(ConfigError) as info:
        validate({"training": training, **extra})
    assert needle in str(info.value), str(info.value)


def test_a_recipe_that_can_run_validates_and_reaches_the_ranks():
    cfg = PipelineConfig.model_validate(
        {
            "training": {
                "lr_schedule": "cosine", "warmup_ratio": 0.05, "min_lr_ratio": 0.1,
                "max_grad_norm": 1.0, "precision": "bf16", "accumulation_steps": 2,
                "early_stopping": {"metric": "loss", "patience": 2}, "init": "champion",
            }
        }
    )  # fmt: skip
    t = cfg.train_config(init_from="/models/v1/model.pt").training
    assert (t.lr_schedule, t.accumulation_steps, t.early_stopping.metric) == ("cosine", 2, "loss")
    assert t.warmup(200) == 10
