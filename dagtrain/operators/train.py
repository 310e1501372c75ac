"""DistributedTrainOperator: the ranks of a training run, through ``dagtrain.launch``."""

from __future__ import annotations

from pathlib import Path
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
        from dagtrain.config import DistributedConfig
        from dagtrain.errors import InputError
        from dagtrain.launch import RankFailure
        from dagtrain.stages.prep import data_file
        from dagtrain.stages.train import record_try, run_train

        cfg = self.run_config(context)
        run = self.run_dir(cfg, context)
        timeout = self.execution_timeout.total_seconds() if self.execution_timeout else None
        dist = cfg.distributed
        if self.ranks:
            dist = DistributedConfig.model_validate({**dist.model_dump(), "ranks": self.ranks})
        if self.round is None:
            manifest = self.manifest(self.data, ("train", "val"))
            out = run / "train"
            tcfg = cfg.train_config(
                distributed=dist,
                data=data_file(manifest, "train"),
                eval_data=data_file(manifest, "val"),
                checkpoint_dir=str(out / "checkpoints"),
                trace_dir=str(out / "traces"),
                status_dir=str(out / "ranks"),
                metrics_file=str(out / "metrics.jsonl"),
            )
        else:
            from dagtrain.stages.rounds import global_path, round_dir

            shard = int(self.shard if self.shard is not None else context["ti"].map_index)
            # a shard the data lacks is refused there, with the files it has
            manifest = self.manifest(self.data, (f"shard-{shard:02d}", "val"))
            out = round_dir(run, self.round) / f"shard-{shard:02d}"
            steps = cfg.rounds.local_steps  # local_steps decides, not epochs
            tcfg = cfg.train_config(
                distributed=dist,
                training=cfg.training.model_copy(
                    update={"max_steps": steps, "epochs": 10**6, "checkpoint_every": steps}
                ),
                data=data_file(manifest, f"shard-{shard:02d}"),
                eval_data=data_file(manifest, "val"),
                init_from=str(global_path(run, self.round)) if self.round else None,
                checkpoint_dir=str(out / "checkpoints"),
                trace_dir=str(out / "traces"),
                status_dir=str(out / "ranks"),
                metrics_file=str(out / "metrics.jsonl"),
            )
        self.log.info(
            "training %s on %d %s rank(s); checkpoints in %s",
            cfg.model.name,
            tcfg.distributed.ranks,
            tcfg.distributed.backend,
            tcfg.checkpoint_dir,
        )
        record_try(tcfg.metrics_file, getattr(context.get("ti"), "try_number", 1))
        try:
            summary = run_train(
                tcfg,
                out,
                timeout=timeout,
                on_line=self.log.info,
                on_start=self._on_start,
                code_dirs=self.code_dirs(cfg, context),
            )
        except RankFailure as e:  # kept for the training page: which rank, how, its lines
            from dagtrain.stages.files import write_json

            try_number = getattr(context.get("ti"), "try_number", 1)
            write_json(
                out / f"failure-try{try_number}.json",
                {
                    "rank": e.rank,
                    "how": e.summary,
                    "error": e.error,
                    "bad_input": isinstance(e, InputError),
                    "exit_code": e.exit_code,
                    "signal": e.signal,
                    "host": getattr(e, "host", None),
                    "log_tail": e.log_tail,
                },
            )
            raise
        if summary.get("resumed_from_step") is not None:
            self.log.info(
                "resumed from step %s; this try trained %s step(s), completing %s epoch(s)",
                summary["resumed_from_step"],
                summary["steps_trained_now"],
                summary["epochs_trained_now"],
            )
        if self.round is not None:
            summary["delta"] = self._write_delta(cfg, manifest, run, out, shard, summary)
            summary["shard"] = shard
            summary["dir"] = str(out)
        return summary

    def _write_delta(self, cfg, manifest, run: Path, out: Path, shard: int, summary) -> dict:
        from dagtrain.stages.rounds import global_model, write_delta
        from dagtrain.training import checkpoint

        base, _, _ = global_model(cfg, manifest, run, self.round)
        local = checkpoint.load(summary["checkpoint"])["model"]
        return write_delta(out, shard, base, local)
