"""Objectives: sums that add up however the batch is cut, the data each one takes, and
what is refused before any work, naming the field."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

from dagtrain.config import ObjectiveConfig, TrainConfig
from dagtrain.errors import InputError
from dagtrain.training.driver.preflight import check
from dagtrain.training.rank.data import DataForm, checked_arrays, load_dataset, read_arrays
from dagtrain.training.rank.models import DataInfo, build_model, evaluate
from dagtrain.training.rank.objective import (
    Classification,
    LanguageModel,
    Regression,
    checked_loss,
    objective_of,
)


def sums_of(objective, out, y):
    s = {"loss": float(objective.loss(out, y)), "units": objective.units(y)}
    return s | dict(zip(objective.tallies, objective.tally(out, y)))


_gen = torch.Generator().manual_seed(35)


@pytest.mark.parametrize(
    ("objective", "out", "y"),
    [
        (
            Classification(),
            torch.randn(12, 5, generator=_gen),
            torch.randint(0, 5, (12,), generator=_gen),
        ),
        (Regression(), torch.randn(12, 3, generator=_gen), torch.randn(12, 3, generator=_gen)),
        (
            LanguageModel(),
            torch.randn(12, 7, 11, generator=_gen),
            torch.randint(0, 11, (12, 7), generator=_gen),
        ),
    ],
)
def test_the_sums_of_parts_give_the_metrics_of_the_whole(objective, out, y):
    whole = objective.compute(sums_of(objective, out, y))
    parts = [sums_of(objective, out[a:b], y[a:b]) for a, b in ((0, 5), (5, 6), (6, 12))]
    total = {k: sum(p[k] for p in parts) for k in parts[0]}
    split = objective.compute(total)
    assert set(whole) == set(objective.metrics)
    for k, v in whole.items():
        # the loss is summed in float32, so a part's sum differs from the whole's in the
        # 7th digit; R^2 = 1 - loss/spread near 0 magnifies that relatively, not absolutely
        assert split[k] == pytest.approx(v, rel=1e-6, abs=1e-6), k


def test_the_built_in_figures_are_what_they_say():
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    m = Regression().compute(sums_of(Regression(), out, y))
    assert m["mse"] == m["loss"] == pytest.approx(1.0) and m["mae"] == pytest.approx(0.5)
    assert m["r2"] == pytest.approx(1 - 4.0 / 5.0)  # SST of 1,2,3,4 about 2.5: 5
    logits = torch.zeros(1, 2, 4)  # uniform over 4 tokens: perplexity 4
    lm = LanguageModel().compute(sums_of(LanguageModel(), logits, torch.tensor([[0, 3]])))
    assert lm["perplexity"] == pytest.approx(4.0) and lm["loss"] == pytest.approx(np.log(4))


def test_evaluation_records_the_metrics_and_the_counts_beside_them():
    model = build_model("mlp", (4,), 3, hidden=[8])
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    m = evaluate(model, x, y, "test")
    assert set(m) == {"test_loss", "test_accuracy", "test_correct", "test_units", "test_samples"}
    assert m["test_accuracy"] == m["test_correct"] / 10 and isinstance(m["test_correct"], int)


def test_a_text_is_cut_into_windows_whose_targets_are_shifted_by_one(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcdefghij", encoding="utf-8")
    form = DataForm("tokens", sequence_length=4, objective="language_model")
    x, y, shape, vocab = read_arrays(str(text), form)
    assert x.dtype == y.dtype == np.int64 and shape == (4,) and vocab == 256
    assert bytes(x[0].tolist()) == b"abcd" and bytes(y[0].tolist()) == b"bcde"
    assert len(x) == 2  # 10 bytes: windows at 0 and 4 (the next needs byte 12)
    ds = load_dataset(str(text), 0.0, 0, normalize=True, form=form)
    assert ds.train.x.dtype == torch.int64  # token ids are not standardised
    assert ds.info.tokens and DataInfo(**{**ds.info.__dict__}).classes == 256


def test_token_files_and_their_vocabulary(tmp_path):
    ids = np.arange(40, dtype=np.uint16) % 7
    ids.tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", ids.astype(np.int32))
    form = DataForm("tokens", sequence_length=8, objective="language_model")
    for name in ("t.bin", "t.npy"):
        x, y, _, vocab = read_arrays(str(tmp_path / name), form)
        assert vocab == 7 and x.shape == (4, 8) and (y[:, :-1] == x[:, 1:]).all()
    small = DataForm("tokens", sequence_length=8, vocab_size=5, objective="language_model")
    with pytest.raises(InputError, match=r"token id 6 is at or above data.vocab_size \(5\)"):
        read_arrays(str(tmp_path / "t.bin"), small)


@pytest.mark.parametrize(
    ("form", "match"),
    [
        (DataForm("tokens", objective="language_model"), r"^data.sequence_length: .* set data"),
        (
            DataForm("tokens", sequence_length=100, objective="language_model"),
            r"data.sequence_length 100 is longer than data .* 40 tokens",
        ),
        (DataForm("classes", sequence_length=8), r"use objective.name: language_model"),
    ],
)
def test_a_text_source_refuses_what_it_cannot_cut(tmp_path, form, match):
    (tmp_path / "t.txt").write_text("x" * 40)
    with pytest.raises(InputError, match=match):
        read_arrays(str(tmp_path / "t.txt"), form)


def test_targets_that_do_not_fit_the_objective_are_refused_naming_the_fix():
    x = np.random.default_rng(0).normal(size=(6, 3))
    with pytest.raises(
        InputError,
        match=r"labels must be integers 0..C-1 for classification.*use objective.name: regression",
    ):
        checked_arrays("d.npz", x, np.linspace(0, 1, 6), None, 0, DataForm("classes"))
    with pytest.raises(InputError, match=r"targets are integers .*objective.name: classification"):
        checked_arrays("d.npz", x, np.arange(6), None, 0, DataForm("values"))
    _, y2, _, outputs = checked_arrays(
        "d.npz", x, np.ones((6, 2), np.float64), None, 0, DataForm("values")
    )
    assert y2.dtype == np.float32 and outputs == 2


def test_a_built_in_takes_no_args_and_an_unimportable_objective_is_named():
    with pytest.raises(InputError, match=r"objective.args .* takes no arguments"):
        objective_of(ObjectiveConfig(name="regression", args={"x": 1}))
    with pytest.raises(InputError, match=r"^objective.name 'nowhere_at_all:obj': cannot import"):
        objective_of(ObjectiveConfig(name="nowhere_at_all:obj"))


OWN = """
from dagtrain.training.rank.objective import Objective


class PerSample(Objective):
    metrics = {"loss": "min"}

    def loss(self, output, target):
        return ((output.squeeze(-1) - target) ** 2)  # one per sample: not a scalar

    def compute(self, sums):
        return {"loss": sums["loss"] / sums["units"]}


def per_sample():
    return PerSample()


def not_an_objective():
    return 42
"""


@pytest.fixture
def own_module(tmp_path, monkeypatch):
    (tmp_path / "own_objectives.py").write_text(textwrap.dedent(OWN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "own_objectives"
    sys.modules.pop("own_objectives", None)


def test_an_own_objective_that_is_not_one_or_gives_no_scalar_is_refused(own_module):
    with pytest.raises(InputError, match=r"returned a int, not an objective"):
        objective_of(ObjectiveConfig(name=f"{own_module}:not_an_objective"))
    own = objective_of(ObjectiveConfig(name=f"{own_module}:per_sample"))
    with pytest.raises(InputError, match=r"its loss of a batch is \(4,\), not a scalar tensor"):
        checked_loss(own, torch.randn(4, 1), torch.randn(4), f"{own_module}:per_sample")


def test_the_preflight_refuses_an_own_objective_and_a_metric_it_does_not_report(own_module):
    spec = {
        "model": {"name": "mlp", "args": {"hidden": [8]}},
        "data": "diabetes",
        "objective": {"name": f"{own_module}:per_sample"},
    }
    with pytest.raises(InputError, match=r"^objective.name .*not a scalar tensor"):
        check(spec)
    ok = check(spec | {"objective": {"name": "regression"}})
    assert ok["ok"] and ok["classes"] == 1  # one value per sample
    with pytest.raises(InputError, match=r"evaluation.metric 'test_accuracy': objective"):
        check(spec | {"objective": {"name": "regression"}, "metric": "test_accuracy"})
    with pytest.raises(InputError, match=r"training.early_stopping.metric 'within': objective"):
        check(spec | {"objective": {"name": "regression"}, "early_stopping_metric": "within"})


def test_a_trainconfig_names_its_objective_in_one_word():
    cfg = TrainConfig(objective="language_model", sequence_length=32)
    assert cfg.objective.name == "language_model" and cfg.objective.targets == "tokens"


def test_integer_features_are_still_features_for_classification_and_regression():
    pixels = np.random.default_rng(0).integers(0, 255, (6, 4), dtype=np.uint8)
    x, *_ = checked_arrays("d.npz", pixels, np.arange(6) % 3, None, 0, DataForm("classes"))
    assert x.dtype == np.float32  # standardised and fed to a float model, as ever
    x, *_ = checked_arrays("d.npz", pixels, np.arange(6) % 3, None, 0, DataForm("any"))
    assert x.dtype == np.int64  # the author's objective: ids stay ids


def test_the_preflight_passes_a_datasets_own_dict_samples_through_model_and_objective():
    here = "tests.unit.training.test_dataset_items"
    spec = {
        "model": {"name": f"{here}:masked_lm"},
        "data": f"{here}:tokens",
        "objective": {"name": f"{here}:next_token"},
    }
    ok = check(spec)
    assert ok["ok"] and ok["classes"] is None  # a Dataset's: counted by prepare_data
    with pytest.raises(InputError, match=r"item 0's target is int64, which regression"):
        check(spec | {"objective": {"name": "regression"}})  # integer targets


def test_an_own_objective_decides_promotion_on_its_first_metric_and_a_diverged_model_never():
    from dagtrain.config import PipelineConfig
    from dagtrain.phases.verdict import better, direction, metric_of

    cfg = PipelineConfig.model_validate({"objective": {"name": "my_objective:huber"}})
    mine = {"within": "max", "mae": "min", "loss": "min"}
    assert metric_of(cfg, mine) == "test_within" and direction(cfg, mine) == "max"
    assert better(cfg, {"test_within": 0.5}, None, mine)[0]
    lm = PipelineConfig.model_validate({"objective": {"name": "language_model"}})
    ok, why = better(lm, {"test_perplexity": float("inf")}, None)
    assert not ok and why == "test perplexity is inf: a diverged model is never promoted"


def test_an_own_objective_on_arrays_refuses_no_targets_and_only_a_language_model_reads_ids():
    x = np.random.default_rng(0).normal(size=(6, 3))
    multi = (np.arange(30).reshape(6, 5) % 2).astype(np.int64)  # multi-label: 0/1 each
    _, y, _, outputs = checked_arrays("d.npz", x, multi, None, 0, DataForm("any"))
    assert y.dtype == np.int64 and outputs == 2
    counts = np.array([0, 3, 7, 3, 0, 9])  # gaps: no class check for an own objective
    assert checked_arrays("d.npz", x, counts, None, 0, DataForm("any"))[3] == 10
    ids = DataInfo((8,), 50, "int64", (8,), "int64", "my_objective:next")
    assert not ids.tokens and DataInfo((8,), 50, "int64", (8,), "int64", "language_model").tokens


def test_evaluation_is_cut_by_output_values_not_only_samples(monkeypatch):
    from dagtrain.training.rank import models
    from dagtrain.training.rank.samples import ArraySamples

    model = build_model(
        "transformer",
        (16,),
        64,
        DataInfo((16,), 64, "int64", (16,), "int64", "language_model"),
        dim=16,
        heads=2,
        layers=1,
    )
    x = torch.randint(0, 64, (40, 16))
    samples = ArraySamples(x, torch.roll(x, -1, 1))
    whole = models.evaluate_samples(model, samples, "test", LanguageModel())
    monkeypatch.setattr(models, "EVAL_OUTPUTS", 16 * 64 * 7)  # 7 windows a pass
    assert models.eval_batch(model, x[:1]) == 7
    cut = models.evaluate_samples(model, samples, "test", LanguageModel())
    assert cut["test_correct"] == whole["test_correct"] and cut["test_units"] == 640
    assert cut["test_loss"] == pytest.approx(whole["test_loss"], rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tally_counts_what_argmax_would_with_ties_and_nans(dtype):
    gen = torch.Generator().manual_seed(7)
    # small integer scores tie often; a tenth of them NaN (argmax takes NaN as highest)
    out = torch.randint(-2, 3, (40, 6, 9), generator=gen).to(dtype)
    out.view(-1)[torch.rand(out.numel(), generator=gen) < 0.1] = float("nan")
    y = torch.randint(0, 9, (40, 6), generator=gen)
    assert LanguageModel().tally(out, y) == [int((out.argmax(dim=-1) == y).sum())]
    flat = out[:, 0]  # (40, 9): classes along dim 1
    assert Classification().tally(flat, y[:, 0]) == [int((flat.argmax(dim=1) == y[:, 0]).sum())]
    images = out.reshape(40, 9, 6)  # (N, C, d): a class per value, along dim 1
    assert Classification().tally(images, y) == [int((images.argmax(dim=1) == y).sum())]
