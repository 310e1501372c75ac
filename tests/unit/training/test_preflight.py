"""The preflight's model check in one process: a batch of the data's shape passes
through the model, on the CPU for a small model and on the meta device for a large one,
and a model that does not take it, or gives other than one logit per class, is named."""

from __future__ import annotations

import pytest

from dagtrain.errors import InputError
from dagtrain.training.driver import preflight

FACTORY = "tests.unit.training.factory"
LARGE = preflight.CPU_FORWARD_PARAMETERS


def spec(name: str, **args) -> dict:
    return {"model": {"name": name, "args": args}, "data": "digits", "device": "cpu"}


def test_a_small_model_that_takes_the_batch_passes():
    got = preflight.check(spec("mlp", hidden=[16]))
    assert got == {
        "ok": True, "in_shape": [1, 8, 8], "classes": 10,
        "parameters": 64 * 16 + 16 + 16 * 10 + 10,
        "samples": 1797,  # the run's steps are counted from them (a warmup checked)
    }  # fmt: skip


def test_a_large_model_passes_on_the_meta_device():
    got = preflight.check(spec(f"{FACTORY}:wide"))
    assert got["ok"] and got["parameters"] > LARGE  # counted, never materialised


@pytest.mark.parametrize("features", [16, LARGE // 10 + 1])  # on the CPU, on meta
def test_a_batch_that_does_not_pass_through_is_named(features):
    with pytest.raises(InputError, match="does not pass through the model"):
        preflight.check(spec(f"{FACTORY}:flat_in", features=features))


def test_a_model_with_other_than_one_logit_per_class_is_named():
    with pytest.raises(InputError, match=r"gives \(3,\) per sample, not one logit per class"):
        preflight.check(spec(f"{FACTORY}:outputs", n=3))


def test_a_model_over_model_max_parameters_is_refused_before_it_is_built():
    """A run's conf may change model.args, not the file's bound on what they build:
    2 x 10^10 parameters (80 GB) are counted on the meta device and refused, in the
    preflight and in a rank (``bounded_model``), naming the fields."""
    import torch

    from dagtrain.config import ModelConfig
    from dagtrain.training.rank.models import bounded_model, build_model

    huge = {"hidden": [100_000, 200_000]}
    with pytest.raises(InputError, match=r"more than model.max_parameters \(100,000,000"):
        preflight.check(spec("mlp", **huge))
    with pytest.raises(InputError, match=r"model.args \{'hidden': \[100000, 200000\]\}"):
        bounded_model(ModelConfig(name="mlp", args=huge), (1, 8, 8), 10)
    # under the bound: the same model, drawn from the generator as an unchecked build
    torch.manual_seed(3)
    checked = bounded_model(ModelConfig(name="mlp", args={"hidden": [16]}), (1, 8, 8), 10)
    torch.manual_seed(3)
    plain = build_model("mlp", (1, 8, 8), 10, hidden=[16])
    for a, b in zip(checked.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    tight = ModelConfig(name="mlp", args={"hidden": [16]}, max_parameters=100)
    with pytest.raises(InputError, match=r"would have 1,210 parameters"):
        bounded_model(tight, (1, 8, 8), 10)
