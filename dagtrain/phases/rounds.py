"""Round-based low-communication training (local SGD / DiLoCo).

Each round, K shards start from the round's global model and train ``local_steps``
inner steps on their own data; each writes its *pseudo-gradient*, the parameter delta
``global - local``, with a sidecar (sha256, shapes, base model digest). The sync phase
checks every contribution (present, complete, checksummed, same shapes and base, finite)
before it reads any of them into the model, averages the deltas, and applies the outer
optimizer, SGD with Nesterov momentum (DiLoCo: lr 0.7, momentum 0.9)::

    v <- mu * v + mean(delta)
    w <- w - lr * (mean(delta) + mu * v)

and writes the next global checkpoint (model + momentum) atomically. Round 0's global
model is the seeded initialisation, rebuilt where needed (deterministic on CPU).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dagtrain.config import PipelineConfig
from dagtrain.errors import InputError
from dagtrain.records.layout import ArtifactLayout, RunLayout, TrainFiles, atomic_write, sha256_file

__all__ = [
    "ShardError",
    "global_model",
    "shard_delta",
    "average_round",
    "average_phase",
    "write_delta",
]


class ShardError(InputError):
    """A shard's contribution is missing or bad; names the shard."""

    def __init__(self, shard: int, why: str) -> None:
        super().__init__(f"shard {shard}: {why}")
        self.shard = shard


def initial_model(cfg: PipelineConfig, manifest: dict[str, Any]) -> dict[str, Any]:
    import torch

    from dagtrain.training.rank.models import DataInfo, build_model

    torch.manual_seed(cfg.training.seed)  # as the trainer does before building
    info = DataInfo.of(manifest, cfg.objective.name)
    model = build_model(cfg.model.name, info.in_shape, info.classes, info, **cfg.model.args)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def global_model(
    cfg: PipelineConfig, manifest: dict[str, Any], run: RunLayout, r: int
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(model state, outer momentum, checkpoint path) that round ``r`` starts from."""
    from dagtrain.training.rank import checkpoint

    if r == 0:
        return initial_model(cfg, manifest), {}, None
    path = run.global_checkpoint(r)
    snap = checkpoint.load(path)
    return snap["model"], snap.get("momentum", {}), str(path)


def shard_delta(
    cfg: PipelineConfig, manifest: dict[str, Any], run: RunLayout, r: int, shard: int, ckpt: str
) -> dict:
    """Write the delta of shard ``shard`` of round ``r``, whose training ended in
    checkpoint ``ckpt``, against the round's global model; return its sidecar."""
    from dagtrain.training.rank import checkpoint

    base, _, _ = global_model(cfg, manifest, run, r)
    local = checkpoint.load(ckpt, mmap=True, optim=False)["model"]
    return write_delta(run.shard(r, shard), shard, base, local)


def write_delta(out: TrainFiles, shard: int, base: dict[str, Any], local: dict[str, Any]) -> dict:
    """Write shard ``shard``'s delta (base - local) and its sidecar; return the sidecar."""
    from dagtrain.training.rank import checkpoint

    delta = {k: (base[k].float() - local[k].float()) for k in base if base[k].is_floating_point()}
    # streamed and hashed on the way, as a checkpoint (its sidecar is delta_sidecar)
    return checkpoint.write(
        out.delta,
        delta,
        shard=shard,
        shapes={k: list(v.shape) for k, v in delta.items()},
        base_sha256=checkpoint.state_digest(base),
    )


def _check(shard: int, d: TrainFiles, expect_shapes: dict[str, list[int]], base_digest: str):
    import torch

    path, side = d.delta, d.delta_sidecar
    if not path.exists() or not side.exists():
        raise ShardError(shard, f"no contribution at {path} (did its training task succeed?)")
    try:
        meta = json.loads(side.read_text())
    except ValueError as e:
        raise ShardError(shard, f"unreadable sidecar {side}: {e}") from e
    if path.stat().st_size != meta.get("bytes") or sha256_file(path) != meta.get("sha256"):
        raise ShardError(shard, f"{path} is truncated or corrupted (checksum mismatch)")
    if meta.get("base_sha256") != base_digest:
        raise ShardError(shard, "it trained from a different global model than this round's")
    try:
        delta = torch.load(path, weights_only=True)
    except Exception as e:  # never on torch's advice to load it with weights_only=False
        raise ShardError(shard, f"{path} is not a delta dagtrain wrote ({type(e).__name__})") from e
    if set(delta) != set(expect_shapes):
        missing = sorted(set(expect_shapes) - set(delta))
        extra = sorted(set(delta) - set(expect_shapes))
        raise ShardError(shard, f"parameters differ: missing {missing}, unexpected {extra}")
    for k, v in delta.items():
        if list(v.shape) != expect_shapes[k]:
            raise ShardError(
                shard, f"parameter {k} has shape {list(v.shape)}, expected {expect_shapes[k]}"
            )
        if not torch.isfinite(v).all():
            raise ShardError(shard, f"parameter {k} has non-finite values (NaN or inf)")
    return delta


def average_phase(
    cfg: PipelineConfig,
    run_id: str,
    data: Any,
    r: int,
    shards: int | None = None,
    dirs: dict[int, Path] | None = None,
) -> dict[str, Any]:
    """The averaging task that closes round ``r`` of DAG run ``run_id``: ``data`` is the
    prepare phase's output, ``shards`` the round's shard count (default: the data's);
    see ``average_round``."""
    from .prep import manifest_of

    manifest = manifest_of(cfg, data, ())  # reads no data file
    k = shards or manifest["shards"]
    run = ArtifactLayout.of(cfg).run(run_id)
    for shard, d in (dirs or {}).items():  # from the shards' XComs: only their own folders
        if Path(d).resolve() != run.shard(r, shard).dir.resolve():
            raise InputError(
                f"contributions: shard {shard} of round {r} names {Path(d).name!r}, not its "
                "own folder in this run; a task's output names only the run's own files"
            )
    return average_round(cfg, manifest, run, r, k, dirs)


def average_round(
    cfg: PipelineConfig,
    manifest: dict[str, Any],
    run: RunLayout,
    r: int,
    shards: int,
    dirs: dict[int, Path] | None = None,
) -> dict[str, Any]:
    """Check all K contributions of round ``r``, then write the global model of ``r + 1``
    and ``round-NN/global.json`` (the return value: norm of the mean pseudo-gradient, the
    new global model's validation metrics).

    ``dirs`` maps each shard to the folder of its contribution (default: the round's
    ``shard-NN`` folders). Nothing is written unless every shard is good (ShardError names the
    first bad one).
    """
    import torch

    from dagtrain.training.rank import checkpoint
    from dagtrain.training.rank.checkpoint import state_digest

    base, momentum, _ = global_model(cfg, manifest, run, r)
    shapes = {k: list(v.shape) for k, v in base.items() if v.is_floating_point()}
    digest = state_digest(base)
    if dirs is None:
        dirs = {k: run.shard(r, k).dir for k in range(shards)}
    for k in range(shards):
        if k not in dirs:
            raise ShardError(k, "no contribution among the round's outputs (did its task succeed?)")
    deltas = [_check(k, TrainFiles(Path(dirs[k])), shapes, digest) for k in range(shards)]
    mu, lr = cfg.rounds.outer_momentum, cfg.rounds.outer_lr
    new = dict(base)
    new_m: dict[str, Any] = {}
    norm = 0.0
    for k in shapes:
        g = torch.stack([d[k] for d in deltas]).mean(dim=0)
        v = momentum.get(k, torch.zeros_like(g)) * mu + g
        new_m[k] = v
        new[k] = (base[k].float() - lr * (g + mu * v)).to(base[k].dtype)
        norm += float(g.pow(2).sum())
    snap = {"model": new, "momentum": new_m, "round": r + 1}
    path = checkpoint.save(snap, run.globals, r + 1, keep=cfg.rounds.rounds + 1)
    out = {
        "round": r,
        "shards": shards,
        "checkpoint": str(path),
        "pseudo_gradient_norm": math.sqrt(norm),
    }
    if manifest["files"].get("val", {}).get("rows"):  # the new global model, on validation
        from .registry import evaluate_checkpoint

        out["metrics"] = evaluate_checkpoint(cfg, manifest, str(path), "val")
    atomic_write(run.round_result(r), json.dumps(out, indent=1).encode())
    return out
