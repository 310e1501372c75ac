"""The preflight's model check in one process: a batch of the data's shape passes
through the model, on the CPU for a small model and on the meta device for a large one,
and a model that does not take it, or gives other than one logit per class, is named."""

from __future__ import annotations

import pytest

from dagtrain.errors import InputError
from dagtrain.training import preflight

FACTORY = "tests.unit.training.factory"
LARGE = preflight.CPU_FORWARD_PARAMETERS


def spec(name: str, **args) -> dict:
    return {"model": {"name": name, "args": args}, "data": "digits", "device": "cpu"}


def test_a_small_model_that_takes_the_batch_passes():
    got = preflight.check(spec("mlp", hidden=[16]))
    assert got == {
        "ok": True, "in_shape": [1, 8, 8], "classes": 10,
        "parameters": 64 * 16 + 16 + 16 * 10 + 10,
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
