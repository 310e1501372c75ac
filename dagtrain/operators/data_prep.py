"""DataPrepOperator: load, split, normalise (train statistics), shard, write with a manifest."""

from __future__ import annotations

from typing import Any

from ._base import DagtrainOperator, fails_fast_on_bad_input

__all__ = ["DataPrepOperator"]


class DataPrepOperator(DagtrainOperator):
    """Prepare a pipeline's data; return ``{"manifest", "version", "dir", "shards", ...}``.

    The arrays go to ``<artifacts>/<pipeline>/data/<version>/`` (version: a hash of the
    source and the settings), each with its sha256 in ``manifest.json``, which is written
    last. ``shards`` (default: ``rounds.shards`` when given ``for_rounds=True``, else none)
    training shards are cut from the training split. Give ``outlets``
    an Asset to emit a data event; its extra carries the version and the row counts.
    """

    def __init__(self, *, shards: int | None = None, for_rounds: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.shards = shards
        self.for_rounds = for_rounds

    @fails_fast_on_bad_input
    def execute(self, context: Any) -> dict[str, Any]:
        from dagtrain.phases.prep import prepare_phase

        cfg = self.run_config(context)
        shards = self.shards or (cfg.rounds.shards if self.for_rounds else 0)
        out = prepare_phase(cfg, shards)
        self.log.info("data %s prepared in %s: %s", out["version"], out["dir"], out["rows"])
        for outlet in self.outlets or []:
            context["outlet_events"][outlet].extra.update(
                {"version": out["version"], "dir": out["dir"], "rows": out["rows"]}
            )
        return out
