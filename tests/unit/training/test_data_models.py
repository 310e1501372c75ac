"""Data loading and sharding; the model registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagtrain.training.rank.data import load_dataset, shard_batches
from dagtrain.training.rank.models import MODELS, build_model


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_sample_once_per_epoch_across_ranks(world):
    n, batch = 103, 16  # the last global batch is short and splits unevenly
    seen = []
    per_rank = [shard_batches(n, batch, r, world, seed=5, epoch=2) for r in range(world)]
    steps = {len(p) for p in per_rank}
    assert steps == {7}  # every rank takes part in every step
    for r in range(world):
        for idx, count in per_rank[r]:
            seen += idx.tolist()
            assert count <= batch
    assert sorted(seen) == list(range(n))
    # seeded: the same on every call, different per epoch
    again = shard_batches(n, batch, 0, world, seed=5, epoch=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(per_rank[0], again))
    other = shard_batches(n, batch, 0, world, seed=5, epoch=3)
    assert not torch.equal(per_rank[0][0][0], other[0][0])


def test_digits_split_and_normalised_with_train_statistics():
    ds = load_dataset("digits", 0.2, seed=1)
    assert ds.in_shape == (1, 8, 8) and ds.classes == 10
    assert len(ds.x_test) == round(1797 * 0.2)
    assert abs(float(ds.x_train.mean())) < 1e-3  # standardised on train
    assert abs(float(ds.x_test.mean())) > 1e-6  # ... with train's statistics, not its own


@pytest.mark.parametrize("suffix", [".npz", ".npy", ".csv"])
def test_user_arrays(tmp_path, suffix):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=40)
    path = tmp_path / f"d{suffix}"
    if suffix == ".npz":
        np.savez(path, x=x, y=y)
    elif suffix == ".npy":
        np.save(path, np.column_stack([x, y]))
    else:
        np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="a,b,c,label", comments="")
    ds = load_dataset(str(path), 0.25, seed=0)
    assert ds.in_shape == (3,) and ds.classes == 2 and len(ds.x_train) == 30


def test_bad_data_is_named(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_dataset(str(tmp_path / "nope.npz"), 0.2, 0)
    bad = tmp_path / "bad.npz"
    np.savez(bad, features=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="needs arrays 'x'"):
        load_dataset(str(bad), 0.2, 0)
    nan = tmp_path / "nan.npy"
    np.save(nan, np.array([[np.nan, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="NaN"):
        load_dataset(str(nan), 0.2, 0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_builtin_models_classify_digits_shaped_input(name):
    model = build_model(name, (1, 8, 8), 10)
    assert model(torch.zeros(5, 64)).shape == (5, 10)


def test_user_model_by_import_path_and_clear_errors():
    with pytest.raises(ValueError, match="neither a built-in"):
        build_model("resnet9000", (4,), 2)
    with pytest.raises(ValueError, match="cannot import"):
        build_model("no.such.module:build", (4,), 2)
    with pytest.raises(ValueError, match="bad model_args"):
        build_model("mlp", (4,), 2, depth=3)
    model = build_model("tests.unit.training.factory:tiny", (4,), 3, width=5)
    assert model(torch.zeros(2, 4)).shape == (2, 3)


def test_a_factory_that_raises_is_located_at_the_users_line(tmp_path):
    # numpy raises inside its own file: the place to show is the user's call of it; a
    # factory called with arguments it lacks raised in dagtrain: show its definition
    from dagtrain.errors import InputError
    from dagtrain.training.rank.samples import call_factory

    (tmp_path / "mydata.py").write_text(
        "import numpy as np\n\n\ndef broken():\n    return np.load('/no/such/file.npz')\n\n\n"
        "def needs(path):\n    return path\n"
    )
    with pytest.raises(InputError) as info:
        call_factory("mydata:broken", [str(tmp_path)])
    assert f"(at {tmp_path / 'mydata.py'}:5)" in str(info.value), str(info.value)
    with pytest.raises(InputError) as info:
        call_factory("mydata:needs", [str(tmp_path)])
    assert f"(at {tmp_path / 'mydata.py'}:8)" in str(info.value), str(info.value)
