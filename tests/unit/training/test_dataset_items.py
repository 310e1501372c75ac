"""A DAG author's Dataset whose items are not (float vector, class): a dict input of
token ids and a float mask with int64 targets of a shape, trained with the author's own
objective; a float (3, 4) input with float targets, trained as a regression; and the
items that cannot work, refused naming the item and the part of it at fault.

This module is also the author's code that the configs name by import path: the
Datasets, the models and the objective below."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dagtrain.config import TrainConfig, load_config
from dagtrain.errors import InputError
from dagtrain.training.rank.data import data_form, load_dataset
from dagtrain.training.rank.objective import Objective
from dagtrain.training.rank.samples import first_batch
from dagtrain.training.rank.trainer import train

HERE = "tests.unit.training.test_dataset_items"
L, VOCAB = 6, 10  # a sequence's tokens; ids 0..9


class _Items(torch.utils.data.Dataset):
    def __init__(self, item, n: int = 96) -> None:
        self.item, self.n = item, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.item(i)


def _tokens(i: int):
    ids = (i + torch.arange(L)) % VOCAB
    mask = torch.ones(L)
    mask[L - 1 - i % 2 :] = 0.0  # the last one or two positions masked out
    return {"ids": ids, "mask": mask}, (ids + 1) % VOCAB


def tokens() -> _Items:  # ({"ids": int64 (L,), "mask": float32 (L,)}, int64 (L,))
    return _Items(_tokens)


_W = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64).reshape(2, 12)


def _values(i: int):
    x = torch.sin(torch.arange(12, dtype=torch.float64) * (i + 1) * 0.37)
    return (3.0 * x + 5.0).float().reshape(3, 4), (_W @ x).float()


def values() -> _Items:  # (float32 (3, 4), float32 (2,))
    return _Items(_values)


class _MaskedLM(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(vocab, width), nn.Linear(width, vocab)

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.out(self.embed(x["ids"]) * x["mask"].unsqueeze(-1))


def masked_lm(in_shape, classes, width=16):  # takes the dict: ids and mask
    return _MaskedLM(classes, width)


def linear(in_shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), classes))


class NextToken(Objective):
    """Cross-entropy of every position's next token (the masked ones too)."""

    name = "next_token"
    metrics: ClassVar[dict[str, str]] = {"loss": "min", "accuracy": "max"}
    tallies = ("correct",)

    def loss(self, output, target):
        return F.cross_entropy(
            output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="sum"
        )

    def units(self, target) -> int:
        return target.numel()

    def tally(self, output, target) -> list[float]:
        return [int((output.argmax(dim=-1) == target).sum())]

    def compute(self, sums):
        n = max(sums["units"], 1)
        return {"loss": sums["loss"] / n, "accuracy": sums["correct"] / n}


def next_token():
    return NextToken()


def _config(data: str, objective: str, model: str, **kw) -> TrainConfig:
    return TrainConfig(
        data=data,
        objective=objective,
        model=model,
        **{"epochs": 4, "batch_size": 16, "lr": 0.05, "optimizer": "adam", **kw},
    )


def test_a_dict_of_token_ids_and_a_float_mask_trains_with_the_authors_objective():
    cfg = _config(f"{HERE}:tokens", f"{HERE}:next_token", f"{HERE}:masked_lm")
    ds = load_dataset(cfg.data, 0.25, 0, True, data_form(cfg))
    assert (ds.in_shape, ds.classes) == ((L,), VOCAB)  # the largest id + 1
    info = ds.info
    assert (info.in_dtype, info.target_shape, info.target_dtype) == ("int64", (L,), "int64")
    x, y = ds.train.batch(torch.arange(5))
    assert x["ids"].dtype == torch.int64 and x["ids"].shape == (5, L)  # ids stay ids
    assert x["mask"].dtype == torch.float32 and set(x["mask"].unique().tolist()) == {0.0, 1.0}
    assert y.dtype == torch.int64 and y.shape == (5, L)
    assert torch.equal(y, (x["ids"] + 1) % VOCAB)
    whole = ds.x_test
    assert whole["ids"].shape == (24, L) and ds.y_test.shape == (24, L)
    empty, none = ds.train.batch(torch.arange(0))  # a rank's empty share keeps the form
    assert empty["ids"].shape == (0, L) and empty["mask"].dtype == torch.float32
    assert none.shape == (0, L) and none.dtype == torch.int64
    two, targets = first_batch(cfg.data, tokens(), "any")  # what a preflight passes
    assert torch.equal(two["ids"], torch.stack([_tokens(0)[0]["ids"], _tokens(1)[0]["ids"]]))
    assert targets.shape == (2, L)

    result = train(cfg)
    first, last = result.epochs[0], result.epochs[-1]
    assert set(last) >= {"train_loss", "test_loss", "test_accuracy"}
    assert last["train_loss"] < first["train_loss"]
    assert last["test_accuracy"] > first["test_accuracy"]


def test_float_inputs_of_any_shape_train_as_a_regression_of_float_targets():
    cfg = _config(f"{HERE}:values", "regression", f"{HERE}:linear", lr=0.01)
    ds = load_dataset(cfg.data, 0.25, 0, True, data_form(cfg))
    assert (ds.in_shape, ds.classes) == ((3, 4), 2)  # a target's size
    x, y = ds.x_train, ds.y_train
    assert x.shape == (72, 3, 4) and y.shape == (72, 2) and y.dtype == torch.float32
    # one floating input: standardised with the training split's statistics
    assert torch.allclose(x.mean(dim=0), torch.zeros(3, 4), atol=1e-5)
    assert not torch.allclose(ds.x_test.mean(dim=0), torch.zeros(3, 4), atol=1e-3)
    raw = load_dataset(cfg.data, 0.25, 0, False, data_form(cfg)).x_train
    assert float(raw.mean()) > 4.0  # data.normalize off: as the items are

    result = train(cfg)
    first, last = result.epochs[0], result.epochs[-1]
    assert set(last) >= {"test_mse", "test_mae", "test_r2"}
    assert last["train_loss"] < first["train_loss"] * 0.75


@pytest.mark.slow
def test_two_ranks_cut_every_tensor_of_a_dict_batch_alike():
    from dagtrain.training import run_training

    # 15 a step: shares of 8 and 7; each rank's ids, mask and targets cut alike, or the
    # figures part from one process's
    kw = {"batch_size": 15, "epochs": 2, "collective_timeout": 60}
    cfg = _config(f"{HERE}:tokens", f"{HERE}:next_token", f"{HERE}:masked_lm", **kw)
    one = train(cfg)
    two = run_training(  # each rank's items read by a DataLoader worker process
        _config(
            cfg.data, cfg.objective.name, cfg.model.name, backend="torch", data_workers=1, **kw
        ),
        2,
        on_line=lambda line: None,
    )
    assert two.world == 2 and two.steps == one.steps
    for a, b in zip(one.epochs, two.epochs, strict=True):
        assert a["test_units"] == b["test_units"] == 19 * L
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


def test_a_prepared_dataset_records_the_items_form_in_its_manifest(tmp_path: Path):
    from dagtrain.phases.prep import prepare

    p = tmp_path / "tokens.yaml"
    p.write_text(
        "name: tokens\nartifacts: {root: art}\n"
        f"data: {{source: '{HERE}:tokens', normalize: true}}\n"
        f"objective: {{name: '{HERE}:next_token'}}\n"
        f"model: {{name: '{HERE}:masked_lm'}}\n"
    )
    m = prepare(load_config(p))
    assert m["source_kind"] == "factory"
    assert (m["in_shape"], m["classes"]) == ([L], VOCAB)
    assert (m["in_dtype"], m["target_shape"], m["target_dtype"]) == ("int64", [L], "int64")
    split = str(Path(m["dir"]) / m["files"]["train"]["path"])
    ds = load_dataset(split, 0.0, 0, False, data_form(load_config(p).train_config()))
    x, y = ds.train.batch(torch.arange(3))
    assert x["ids"].dtype == torch.int64 and y.shape == (3, L)


# ------------------------------------------------------------------ refusals
def float_label() -> _Items:
    return _Items(lambda i: (torch.zeros(4), 0.5))


def int_values() -> _Items:
    return _Items(lambda i: (torch.zeros(4), torch.tensor([1, 2])))


def float_ids() -> _Items:
    return _Items(lambda i: (torch.zeros(L), torch.zeros(L, dtype=torch.int64)))


def float_next() -> _Items:
    return _Items(lambda i: (torch.zeros(L, dtype=torch.int64), torch.zeros(L)))


def lost_key() -> _Items:  # item 3 on has no mask
    return _Items(lambda i: ({"ids": _tokens(i)[0]["ids"]} if i >= 3 else _tokens(i)[0], i % 2))


def text_key() -> _Items:
    return _Items(lambda i: ({"ids": np.array(["a", "b"]), "mask": torch.ones(2)}, 0))


def short_target() -> _Items:  # item 5's target is one token short
    return _Items(lambda i: (_tokens(i)[0], _tokens(i)[1][: L - (i == 5)]))


def nan_mask() -> _Items:
    def item(i):
        x, y = _tokens(i)
        x["mask"][0] = float("nan") if i == 2 else 1.0
        return x, y

    return _Items(item)


def negative_ids() -> _Items:
    return _Items(lambda i: (_tokens(i)[0]["ids"], _tokens(i)[1] - 20 * (i == 40)))


def dtype_change() -> _Items:  # item 7's ids are floats
    return _Items(lambda i: ((torch.arange(L) * (1.0 if i == 7 else 1)), i % 2))


@pytest.mark.parametrize(
    ("factory", "objective", "needle"),
    [
        ("float_label", "classification", "item 0's label is 0.5; labels must be integers"),
        ("int_values", "regression", "item 0's target is int64, which regression"),
        ("float_ids", "language_model", "item 0's features are float32; a language model"),
        ("float_next", "language_model", "item 0's target is float32; a language model"),
        ("lost_key", "classification", "item 3's input is a dict of ['ids'], item 0's a dict"),
        ("text_key", f"{HERE}:next_token", "item 0's input 'ids' is <U1, not numbers"),
        ("short_target", f"{HERE}:next_token", "item 5's target is int64 of shape (5,)"),
        ("nan_mask", f"{HERE}:next_token", "item 2's input 'mask' holds NaN or infinity"),
        ("negative_ids", "language_model", "item 40's target holds negative token ids"),
        ("dtype_change", f"{HERE}:next_token", "item 7's features are float32, item 0's int64"),
    ],
)
def test_an_item_that_does_not_fit_is_refused_naming_the_item_and_its_part(
    factory, objective, needle
):
    cfg = _config(f"{HERE}:{factory}", objective, "mlp")
    with pytest.raises(InputError, match=r"data\.source") as info:
        load_dataset(cfg.data, 0.25, 0, True, data_form(cfg))
    assert needle in str(info.value)


def test_token_ids_at_or_above_the_vocabulary_name_data_vocab_size():
    cfg = _config(f"{HERE}:tokens", "language_model", "mlp", vocab_size=8)
    with pytest.raises(InputError, match=r"token id 9 is at or above data\.vocab_size \(8\)"):
        load_dataset(cfg.data, 0.25, 0, True, data_form(cfg))
