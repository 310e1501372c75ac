"""RoundAveragingOperator: the barrier and averaging phase of round-based training.

(Per-step gradient allreduce inside a training task is ``dagtrain.sync``; this operator
averages whole rounds of local training across Airflow tasks.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagtrain.errors import InputError

from ._base import DagtrainOperator, fails_fast_on_bad_input

__all__ = ["RoundAveragingOperator"]


class RoundAveragingOperator(DagtrainOperator):
    """Close round ``round``: check every shard's delta, average, apply the outer optimizer.

    It refuses to proceed unless each of the K shards' contributions (K: ``shards``, by
    default the data's shard count) is present, matches its sha256, has the global
    model's parameter shapes, started from this round's global model and is finite; a
    bad one fails the task with ``shard N: why`` and nothing is written. Then the mean
    delta goes through SGD with Nesterov momentum (``rounds.outer_lr``,
    ``rounds.outer_momentum``, as in DiLoCo) into the next round's global checkpoint.

    ``contributions``, optional: the round's mapped training outputs (an XComArg; each a
    dict with ``shard`` and ``dir``) or ``{shard: folder}``; by default each shard's
    contribution is looked for in the round's artifact folder ``shard-NN``. Either way
    all K shards must be there.
    """

    template_fields = ("data", "contributions")

    def __init__(
        self,
        *,
        data: Any,
        round: int,
        shards: int | None = None,
        contributions: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.data = data
        self.round = round
        self.shards = shards
        self.contributions = contributions

    @fails_fast_on_bad_input
    def execute(self, context: Any) -> dict[str, Any]:
        from dagtrain.phases.rounds import average_phase

        cfg = self.run_config(context)
        result = average_phase(
            cfg, context["run_id"], self.data, self.round, self.shards, self._dirs()
        )
        k = result["shards"]
        self.log.info(
            "round %d: %d shards averaged, |pseudo-gradient| %.4g; global model %s",
            self.round,
            k,
            result["pseudo_gradient_norm"],
            result["checkpoint"],
        )
        return result

    def _dirs(self) -> dict[int, Path] | None:
        c = self.contributions
        if c is None:
            return None
        if isinstance(c, dict):
            return {int(k): Path(v) for k, v in c.items()}
        out: dict[int, Path] = {}
        for item in c:
            if not isinstance(item, dict) or "shard" not in item or "dir" not in item:
                raise InputError(
                    f"contributions: expected dicts with 'shard' and 'dir' (a round's "
                    f"training outputs), got {item!r}"
                )
            out[int(item["shard"])] = Path(item["dir"])
        return out
