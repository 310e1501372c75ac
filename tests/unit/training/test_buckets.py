"""Gradient buckets: the size rule, the flat parameter buffers, the optimizer state in
checkpoints, and which step (overlapped or plain) a layout gets."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dagtrain.sync.local import LocalBackend
from dagtrain.training import TrainConfig
from dagtrain.training.rank import overlap
from dagtrain.training.rank.buckets import make_buckets
from dagtrain.training.rank.step import NonFiniteGradients, StepGraph

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


def test_a_pipeline_stage_buckets_its_gradients_by_the_same_rule():
    from dagtrain.training.rank.buckets import stage_buckets

    model = mlp(64, 512, 512, 512, 512, 64)
    stage = stage_buckets(list(reversed(list(model.parameters()))), bucket_mb=2.5)
    step = make_buckets(model, bucket_mb=2.5)
    assert [b.flat.numel() for b in stage] == [b.flat.numel() for b in step]
    assert [len(b.params) for b in stage] == [3, 4, 3]


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
    from dagtrain.training.rank.models import build_model

    cnn = build_model("rescnn", (64,), 10, channels=48, blocks=4)
    assert len(make_buckets(cnn, 25)) == 1  # 0.67 MB: the plain step
    big = build_model("mlp", (64,), 10, hidden=[2048] * 6)
    buckets = make_buckets(big, 25)
    # the 2048x10 output layer (and a bias) first, then one 16 MB layer per bucket
    assert buckets[0].names == ["13.bias", "13.weight", "11.bias"]
    assert [len(b.params) for b in buckets] == [3, 2, 2, 2, 2, 3]


def choose(cost, steps: int, backend=None, traced=()) -> list[bool]:
    """The kinds an OverlapChoice runs over ``steps`` steps whose seconds are
    ``cost(kind, step)`` (True: overlapped)."""
    from dagtrain.training.rank.overlap import OverlapChoice

    c = OverlapChoice(backend or LocalBackend())
    kinds = []
    for i in range(steps):
        kinds.append(c.next(traced=i in traced))
        c.done(cost(kinds[-1], i))
    return kinds


def trial_kinds() -> list[bool]:
    from dagtrain.training.rank import overlap as s

    # overlapped to warm up, then plain steps and an overlapped one, in turn
    return [True] * s.TRIAL_SKIP + ([False] * s.PLAIN_RUN + [True]) * s.TRIAL_STEPS


def probe_block(kept: bool, blocks: int = 1) -> list[bool]:
    """``blocks`` blocks of the kept kind, the last one ending with a probe of the other
    kind: one overlapped step, or PLAIN_RUN plain ones."""
    from dagtrain.training.rank import overlap as s

    size = s.PLAIN_RUN if kept else 1
    return [kept] * (blocks * s.REVIEW_EVERY - size) + [not kept] * size


@pytest.mark.parametrize(
    ("overlapped", "plain", "kept"),
    [(1.0, 2.0, True), (2.0, 1.0, False), (0.99, 1.0, False), (1.0, 1.0, False)],
)
def test_overlap_is_kept_only_where_the_trial_measures_it_faster_by_the_margin(
    overlapped, plain, kept
):
    from dagtrain.training.rank import overlap as s

    assert 0.01 < s.MARGIN < 0.05  # 1% faster is not enough: the plain step is kept
    kinds = choose(lambda kind, _: overlapped if kind else plain, 60)
    n = len(trial_kinds())
    assert kinds[:n] == trial_kinds()
    # the verdict, then the other kind closes the first block (a probe)
    assert kinds[n : n + s.REVIEW_EVERY] == probe_block(kept)
    # the probe agreed: the next one comes after twice as many steps
    assert kinds[n + s.REVIEW_EVERY : n + 3 * s.REVIEW_EVERY] == probe_block(kept, 2)


def test_a_plain_step_right_after_an_overlapped_one_is_not_timed():
    # the plain step is 5% faster, but 30% slower right after an overlapped step (what
    # mpirun ranks on 2 shared cores do, less): a trial of alternating steps would see
    # overlap faster
    def cost(kind: bool, step: int) -> float:
        if not kind and step > 0 and kinds and kinds[-1]:
            return 1.3
        return 1.05 if kind else 1.0

    from dagtrain.training.rank.overlap import OverlapChoice

    c = OverlapChoice(LocalBackend())
    kinds: list[bool] = []
    for i in range(200):
        kind = c.next()
        c.done(cost(kind, i))
        kinds.append(kind)
    n = len(trial_kinds())
    assert c.log[0][:2] == (n, False) and len(c.log) == 1  # plain, and it holds
    assert all(0.04 < d < 0.06 for d in c.pairs)  # plain steps after plain ones only


def test_probes_of_the_slower_kind_become_rare_while_the_verdict_holds():
    from dagtrain.training.rank import overlap as s

    steps = 2000
    kinds = choose(lambda kind, _: 1.1 if kind else 1.0, steps)
    after = kinds[len(trial_kinds()) :]
    probes = [i for i, k in enumerate(after) if k]  # one overlapped step each
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:4] == [20, 40, 80, 160] and set(gaps[4:]) == {s.PROBE_MAX}
    assert len(probes) < steps / s.PROBE_MAX + 5  # under 1% of the steps


@pytest.mark.parametrize("overlap_first", [True, False])
def test_the_verdict_follows_the_faster_kind_when_it_changes(overlap_first):
    from dagtrain.training.rank import overlap as s

    change = 100  # from this step on, the other kind is the faster

    def cost(kind: bool, step: int) -> float:
        faster = overlap_first if step < change else not overlap_first
        return 1.0 if kind == faster else 1.2

    kinds = choose(cost, 400)
    n = len(trial_kinds())
    assert kinds[n : n + s.REVIEW_EVERY] == probe_block(overlap_first)
    # after the change the kept kind's steps run slower than around the last probe, so
    # probes come every block until the verdict turns; then it holds
    switched = next(
        i
        for i in range(change, 400)
        if all(k != overlap_first for k in kinds[i : i + s.REVIEW_EVERY - s.PLAIN_RUN])
    )
    # a block to see it, then a probe a block until most of the window says so
    assert switched < change + (s.WINDOW // 2 + 3) * s.REVIEW_EVERY
    rest = kinds[switched:]
    assert rest.count(overlap_first) <= s.PLAIN_RUN * (len(rest) // s.REVIEW_EVERY)  # probes


def test_overlap_once_kept_stays_while_faster_by_the_smaller_margin():
    from dagtrain.training.rank import overlap as s
    from dagtrain.training.rank.overlap import OverlapChoice

    assert s.KEEP_MARGIN < s.MARGIN
    c = OverlapChoice(LocalBackend())
    faster = [(0, 0.05), (150, 0.015), (600, 0.0)]  # (from step, overlap faster by)
    for i in range(1000):
        kind = c.next()
        by = next(f for start, f in reversed(faster) if i >= start)
        c.done(1.0 - by if kind else 1.0)
    verdicts = [(step, kept) for step, kept, _ in c.log]
    # kept at 5%, still at 1.5% (a new trial would not take it up), off at 0%
    assert verdicts[0] == (len(trial_kinds()), True)
    assert [k for _, k in verdicts] == [True, False]
    assert 600 < verdicts[1][0] < 600 + s.PROBE_MAX + (s.WINDOW // 2 + 3) * s.REVIEW_EVERY


def test_a_traced_step_runs_the_kept_kind_and_the_probe_waits_for_a_later_block():
    from dagtrain.training.rank import overlap as s

    n = len(trial_kinds())
    probe = n + s.REVIEW_EVERY - 1  # an overlapped step, where plain is kept
    kinds = choose(lambda kind, _: 2.0 if kind else 1.0, n + 2 * s.REVIEW_EVERY, traced={probe})
    assert kinds[n:probe] == [False] * (s.REVIEW_EVERY - 1)
    assert kinds[probe] is False and kinds[probe + s.REVIEW_EVERY] is True


def test_every_rank_runs_the_kind_rank_0_measures_faster():
    import threading

    class Ranks:  # two ranks as threads: broadcast through a shared slot
        def __init__(self) -> None:
            self.barrier = threading.Barrier(2)
            self.slot: list[torch.Tensor] = []

    class Rank(LocalBackend):
        def __init__(self, ranks: Ranks, rank: int) -> None:
            super().__init__()
            self.ranks, self.rank, self.size = ranks, rank, 2
            self.broadcasts = 0

        def broadcast(self, tensors, root=0):
            self.broadcasts += 1
            if self.rank == root:
                self.ranks.slot = [t.clone() for t in tensors]
            self.ranks.barrier.wait(timeout=10)
            if self.rank != root:
                for t, src in zip(tensors, self.ranks.slot):
                    t.copy_(src)
            self.ranks.barrier.wait(timeout=10)

    ranks = Ranks()
    backends = [Rank(ranks, 0), Rank(ranks, 1)]
    kinds: dict[int, list[bool]] = {}

    def rank_main(rank: int) -> None:
        # rank 0 measures overlap faster until step 80, rank 1 always the plain step
        def cost(kind: bool, step: int) -> float:
            return 1.0 if kind == (rank == 0 and step < 80) else 1.3

        kinds[rank] = choose(cost, 200, backends[rank])

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert kinds[0] == kinds[1]
    assert backends[0].broadcasts == backends[1].broadcasts > 10
    assert kinds[0][20:30].count(True) >= 8 and kinds[0][170:].count(True) <= 4


def test_the_step_graph_runs_the_kind_chosen_and_counts_only_overlapped_steps(monkeypatch):
    from dagtrain.training.rank import step as step_module

    clock = [0.0]  # a fake clock: the plain step is the faster
    monkeypatch.setattr(step_module, "perf_counter", lambda: clock[0])
    sg = step_graph(mlp(6, 5, 3), bucket_mb=0.0001)
    kinds = []
    for graph, cost, kind in ((sg.graph, 2.0, True), (sg.plain_graph, 1.0, False)):
        run = graph.run

        def timed(*a, run=run, cost=cost, kind=kind, **kw):
            kinds.append(kind)
            clock[0] += cost
            return run(*a, **kw)

        graph.run = timed
    batch = (torch.randn(4, 6), torch.arange(4) % 3, 4)
    n = len(trial_kinds())
    for _ in range(n + overlap.REVIEW_EVERY + 2):
        sg.run(batch)
    assert kinds[:n] == trial_kinds()
    assert kinds[n:] == [*probe_block(False), False, False]
    assert sg.choice.kept is False and sg.overlapping is False
    # no plain step left a signal for the next overlapped run
    assert all("early" not in repr(b.event) for b in sg.buckets)


def test_the_trial_does_not_change_the_result():
    from dagtrain.training import train

    kw = {"epochs": 1, "max_steps": 14, "bucket_mb": 0.02, "model_args": {"hidden": [64]}}
    on = train(TrainConfig(overlap=True, **kw))
    off = train(TrainConfig(overlap=False, **kw))
    assert on.params_sha256 == off.params_sha256 and on.steps == 14


class _WithUnused(nn.Module):
    """An MLP and a layer that forward never uses: its gradient is never computed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(6, 17, 9, 3)
        self.unused = nn.Linear(6, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize("overlap", [True, False])
def test_gradients_copied_in_by_the_hook_or_added_by_autograd_give_the_same_parameters(
    monkeypatch, overlap
):
    from dagtrain.training.rank import buckets as buckets_module

    x, y = torch.randn(8, 6, generator=torch.Generator().manual_seed(3)), torch.arange(8) % 3
    results = []
    for numel in (1, 50, 1 << 40):  # every gradient copied, the large ones, none
        monkeypatch.setattr(buckets_module, "COPY_NUMEL", numel)
        model = _WithUnused()
        sg = step_graph(model, bucket_mb=0.0004, overlap=overlap, weight_decay=0.01)
        assert len(sg.buckets) > 2
        copied = sum(len(b.copied) for b in sg.buckets)
        assert copied == {1: 8, 50: 3, 1 << 40: 0}[numel]
        for _ in range(4):
            sg.run((x, y, 8))
        for b in sg.buckets:  # after a step, every .grad is its view of the bucket again
            for p, view in zip(b.params, b.grads):
                assert p.grad.data_ptr() == view.data_ptr()
        assert not model.unused.weight.grad.any() and not model.unused.bias.grad.any()
        results.append([p.detach().clone() for p in model.parameters()])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("fused", [True, False])
def test_the_pass_that_averages_a_bucket_checks_it_and_divides_exactly(monkeypatch, size, fused):
    from dagtrain.training.rank import step as step_module

    if not fused:  # a torch without GradScaler's kernel
        monkeypatch.setattr(step_module, "_unscale", None)

    class Ranks(LocalBackend):
        def __init__(self) -> None:
            super().__init__()
            self.size = size

    sg = StepGraph(TrainConfig(model_args={"hidden": [5]}), mlp(6, 5, 3), Ranks())
    (b,) = sg.buckets
    summed = torch.randn(b.flat.numel(), generator=torch.Generator().manual_seed(0)) * 1e-3
    b.flat.copy_(summed)
    sg._allreduce(b)  # the local backend's sum is the bucket itself
    assert b.finite and torch.equal(b.flat, summed / size)  # bit for bit the division
    b.flat.copy_(summed)
    b.flat[3] = float("nan")
    with pytest.raises(NonFiniteGradients, match="step 0: non-finite gradients in bucket 0"):
        sg._allreduce(b)
    b.flat.copy_(summed)
    b.flat[-1] = float("-inf")
    sg.cfg.training.nonfinite = "skip"
    sg._allreduce(b)
    sg._check_all()
    assert not b.finite and not sg.finite and sg.skipped == 1
