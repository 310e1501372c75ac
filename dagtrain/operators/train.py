"""DistributedTrainOperator: the ranks of a training run, through ``dagtrain.launch``."""

from __future__ import annotations

from typing import Any

from dagtrain.plugins.links import TraceLink, TrainingReportLink

from ._base import DagtrainOperator, fails_fast_on_bad_input

__all__ = ["DistributedTrainOperator"]


class DistributedTrainOperator(DagtrainOperator):
    """Train on ``distributed.ranks`` ranks of ``distributed.backend``; return metrics.

    ``data`` is a DataPrepOperator's output (an XComArg). Checkpoints go to the run's
    artifact directory (``runs/<run>/train/checkpoints``), which does not change between
    tries: a retry resumes from the newest valid checkpoint there, and the result says
    how many epochs it trained itself (``epochs_trained_now``). ``on_kill`` (and an
    ``execution_timeout``) kills every rank's process group.

    With ``round`` set, the task is one shard of round-based training: it starts from
    the round's global model, trains ``rounds.local_steps`` steps on shard ``shard``'s
    data, and writes its parameter delta for the RoundAveragingOperator of the round.
    """

    operator_extra_links = (TrainingReportLink(), TraceLink())

    template_fields = ("data", "shard")

    def __init__(
        self,
        *,
        data: Any,
        ranks: int | None = None,
        round: int | None = None,
        shard: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.data = data
        self.ranks = ranks
        self.round = round
        self.shard = shard
        self._job = None

    def _on_start(self, job) -> None:
        self._job = job

    def on_kill(self) -> None:
        job = self._job
        if job is not None:
            self.log.info("killing every rank of the training job")
            job.kill(grace=2.0)

    @fails_fast_on_bad_input
    def execute(self, context: Any) -> dict[str, Any]:
        from dagtrain.phases.train import train_phase

        cfg = self.run_config(context)
        ti = context.get("ti")
        shard = None
        if self.round is not None:
            shard = int(self.shard if self.shard is not None else ti.map_index)
        return train_phase(
            cfg,
            context["run_id"],
            self.data,
            try_number=getattr(ti, "try_number", 1),
            ranks=self.ranks,
            round=self.round,
            shard=shard,
            timeout=self.execution_timeout.total_seconds() if self.execution_timeout else None,
            log=self.log,
            on_start=self._on_start,
            code_dirs=self.code_dirs(cfg, context),
            airflow=self.airflow_run(context),
        )
