"""Gradient buckets: the size rule, the flat parameter buffers, the optimizer state in
checkpoints, and which step (overlapped or plain) a layout gets."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dagtrain.sync.local import LocalBackend
from dagtrain.training import TrainConfig
from dagtrain.training.step import StepGraph, make_buckets

MB = 2**20


def mlp(*widths: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def nbytes(b) -> int:
    return b.flat.numel() * b.flat.element_size()


def test_the_first_bucket_is_small_and_the_others_hold_up_to_bucket_mb():
    # Linear layers 0, 2, 4, 6, 8: 0.13 MB, three of 1 MB, 0.13 MB (weights; biases 2 KB)
    model = mlp(64, 512, 512, 512, 512, 64)
    buckets = make_buckets(model, bucket_mb=2.5)
    assert [b.names for b in buckets] == [
        ["8.bias", "8.weight", "6.bias"],  # backward's first gradients; 6.weight passes 1 MB
        ["6.weight", "4.bias", "4.weight", "2.bias"],
        ["2.weight", "0.bias", "0.weight"],
    ]
    assert nbytes(buckets[0]) <= 1 * MB
    assert all(nbytes(b) <= 2.5 * MB for b in buckets[1:])
    # bucket_mb below 1 MB caps the first bucket too
    assert all(nbytes(b) <= 0.2 * MB for b in make_buckets(mlp(64, 64, 64, 64), 0.2))


def test_every_parameter_is_in_exactly_one_bucket_in_reverse_order():
    model = mlp(8, 300, 700, 5)
    for mb in (0.001, 0.5, 1, 25):
        buckets = make_buckets(model, mb)
        names = [n for b in buckets for n in b.names]
        assert names == [n for n, _ in reversed(list(model.named_parameters()))]
        assert [b.index for b in buckets] == list(range(len(buckets)))


def test_a_parameter_larger_than_the_cap_has_a_bucket_of_its_own():
    buckets = make_buckets(mlp(1024, 1024, 4), bucket_mb=0.5)  # the 4 MB weight
    assert [b.names for b in buckets] == [["2.bias", "2.weight", "0.bias"], ["0.weight"]]


def test_parameters_of_another_dtype_start_a_bucket():
    model = mlp(4, 4, 4)
    model[0].double()
    buckets = make_buckets(model, bucket_mb=25)
    assert [[p.dtype for p in b.params] for b in buckets] == [
        [torch.float32, torch.float32],
        [torch.float64, torch.float64],
    ]


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    model = mlp(6, 5, 3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    (b,) = make_buckets(model, bucket_mb=25)
    for name, p, off in zip(b.names, b.params, b.offsets):
        assert torch.equal(p, before[name])  # values kept
        assert p.data_ptr() == b.param.data_ptr() + off * p.element_size()
        assert p.grad.data_ptr() == b.flat.data_ptr() + off * p.element_size()
    with torch.no_grad():
        b.param.add_(1.0)  # what the optimizer does
    assert all(torch.equal(p, before[n] + 1.0) for n, p in zip(b.names, b.params))
    model(torch.ones(2, 6)).sum().backward()  # backward writes into the flat buffer
    assert b.flat.abs().sum() > 0 and b.param.grad is b.flat


def step_graph(model: nn.Module, **kw) -> StepGraph:
    cfg = TrainConfig(model_args={"hidden": [5]}, **kw)
    return StepGraph(cfg, model, LocalBackend())


@pytest.mark.parametrize(
    ("optimizer", "extra"),
    [
        ("sgd", {"momentum": 0.9, "weight_decay": 0.01}),
        ("adam", {"weight_decay": 0.01}),
        ("adamw", {"weight_decay": 0.1}),
    ],
)
def test_the_flat_update_is_bitwise_the_per_parameter_one(optimizer, extra):
    a, b = mlp(6, 17, 9, 3), mlp(6, 17, 9, 3)
    sg = step_graph(a, bucket_mb=0.0004, optimizer=optimizer, lr=0.05, **extra)
    assert len(sg.buckets) > 1
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer]
    ref = opt(b.parameters(), lr=0.05, **extra)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    for _ in range(3):
        for bucket in sg.buckets:
            bucket.flat.zero_()
        ref.zero_grad()
        nn.functional.cross_entropy(a(x), y).backward()
        nn.functional.cross_entropy(b(x), y).backward()
        for bucket in sg.buckets:
            bucket.optimizer.step()
        ref.step()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def trained(model: nn.Module, bucket_mb: float, steps: int, states=None) -> StepGraph:
    sg = step_graph(model, bucket_mb=bucket_mb, optimizer="adam", lr=0.01)
    if states is not None:
        sg.load_optimizer_states(states)
    x, y = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 3
    for _ in range(steps):
        for b in sg.buckets:
            b.flat.zero_()
        nn.functional.cross_entropy(model(x), y).backward()
        for b in sg.buckets:
            b.optimizer.step()
    return sg


def test_optimizer_states_are_saved_per_parameter_and_load_under_any_layout():
    whole = mlp(6, 17, 9, 3)
    trained(whole, 0.0004, 4)
    first = mlp(6, 17, 9, 3)
    sg = trained(first, 0.0004, 2)
    states = copy.deepcopy(sg.optimizer_states())
    # the format of an optimizer over the bucket's parameters one by one
    for b, s in zip(sg.buckets, states):
        assert s["param_groups"][0]["params"] == list(range(len(b.params)))
        assert [s["state"][i]["exp_avg"].shape for i in range(len(b.params))] == [
            p.shape for p in b.params
        ]
        ref = torch.optim.Adam(b.params, lr=0.01)
        ref.load_state_dict(s)  # a plain torch optimizer takes it as it is
    # resumed with another bucket layout: the same parameters, bit for bit
    second = mlp(6, 17, 9, 3)
    second.load_state_dict(first.state_dict())
    resumed = trained(second, 25, 2, states)
    assert len(resumed.buckets) != len(sg.buckets)
    for p, q in zip(second.parameters(), whole.parameters()):
        assert torch.equal(p, q)


def test_optimizer_states_of_another_model_are_refused_by_name():
    states = trained(mlp(6, 17, 9, 3), 25, 1).optimizer_states()
    with pytest.raises(ValueError, match="6 parameters, this model 4"):
        step_graph(mlp(6, 5, 3)).load_optimizer_states(states)
    with pytest.raises(ValueError, match=r"exp_avg' of 4\.weight does not have"):
        step_graph(mlp(6, 17, 8, 3)).load_optimizer_states(states)


def test_the_plain_step_runs_in_the_calling_thread_and_overlap_on_the_workers():
    one = step_graph(mlp(6, 5, 3), bucket_mb=25, workers=3)
    assert not one.overlap and one.workers == 1  # one bucket: nothing to overlap
    off = step_graph(mlp(6, 5, 3), bucket_mb=0.0001, overlap=False, workers=3)
    assert len(off.buckets) > 1 and not off.overlap and off.workers == 1
    on = step_graph(mlp(6, 5, 3), bucket_mb=0.0001, workers=3)
    assert on.overlap and on.workers == 3
    batch = (torch.randn(4, 6), torch.arange(4) % 3, 4)
    for sg, lanes in ((one, {0}), (off, {0})):
        reports = []
        run = sg.graph.run
        sg.graph.run = lambda *a, run=run, **kw: reports.append(run(*a, **kw)) or reports[-1]
        sg.run(batch)
        assert set(reports[0].workers_of) == lanes and reports[0].workers == 1
    on.run(batch)
    assert on.step == 1


def test_the_residual_cnn_has_one_bucket_and_the_21m_mlp_a_small_first_one():
    from dagtrain.training.models import build_model

    cnn = build_model("rescnn", (64,), 10, channels=48, blocks=4)
    assert len(make_buckets(cnn, 25)) == 1  # 0.67 MB: the plain step
    big = build_model("mlp", (64,), 10, hidden=[2048] * 6)
    buckets = make_buckets(big, 25)
    # the 2048x10 output layer (and a bias) first, then one 16 MB layer per bucket
    assert buckets[0].names == ["13.bias", "13.weight", "11.bias"]
    assert [len(b.params) for b in buckets] == [3, 2, 2, 2, 2, 3]


@pytest.mark.parametrize(("overlapped", "plain", "kept"), [(1.0, 2.0, True), (2.0, 1.0, False)])
def test_overlap_is_kept_only_where_the_trial_measures_it_faster(
    monkeypatch, overlapped, plain, kept
):
    from dagtrain.training import step as step_module

    clock = [0.0]  # a fake clock: each kind of step takes what the test says
    monkeypatch.setattr(step_module, "perf_counter", lambda: clock[0])
    sg = step_graph(mlp(6, 5, 3), bucket_mb=0.0001)
    kinds = []
    for graph, cost, kind in ((sg.graph, overlapped, True), (sg.plain_graph, plain, False)):
        run = graph.run

        def timed(*a, run=run, cost=cost, kind=kind, **kw):
            kinds.append(kind)
            clock[0] += cost
            return run(*a, **kw)

        graph.run = timed
    batch = (torch.randn(4, 6), torch.arange(4) % 3, 4)
    n = step_module.TRIAL_SKIP + 2 * step_module.TRIAL_STEPS
    for _ in range(n + 3):
        sg.run(batch)
    # overlapped while warming up, then plain and overlapped in turn, then the verdict
    assert kinds[:n] == [True] * step_module.TRIAL_SKIP + [False, True] * step_module.TRIAL_STEPS
    assert kinds[n:] == [kept] * 3 and sg.trial is None and sg.overlapping is kept
    assert bool(sg._hooks) is kept  # a plain run counts no gradients
    # no plain step left a signal for the next overlapped run
    assert all("early" not in repr(b.event) for b in sg.buckets)


def test_the_trial_does_not_change_the_result():
    from dagtrain.training import train

    kw = {"epochs": 1, "max_steps": 14, "bucket_mb": 0.02, "model_args": {"hidden": [64]}}
    on = train(TrainConfig(overlap=True, **kw))
    off = train(TrainConfig(overlap=False, **kw))
    assert on.params_sha256 == off.params_sha256 and on.steps == 14
