"""EvaluateOperator and PromoteOperator: champion / challenger over the model registry."""

from __future__ import annotations

from typing import Any

from dagtrain.plugins.links import TraceLink, TrainingReportLink

from ._base import DagtrainOperator, fails_fast_on_bad_input

__all__ = ["EvaluateOperator", "PromoteOperator"]


class EvaluateOperator(DagtrainOperator):
    """Test metrics of a checkpoint, compared with the promoted model's.

    ``model`` is a training or sync task's output (a dict with ``checkpoint``) or a
    checkpoint path; ``data`` a DataPrepOperator's output. Returns the metrics, the
    champion's version and metrics, and ``better`` with the reason.
    """

    operator_extra_links = (TrainingReportLink(), TraceLink())

    template_fields = ("data", "model")

    def __init__(self, *, data: Any, model: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = data
        self.model = model

    @fails_fast_on_bad_input
    def execute(self, context: Any) -> dict[str, Any]:
        from dagtrain.phases.registry import evaluate_phase

        cfg = self.run_config(context)
        return evaluate_phase(
            cfg,
            context["run_id"],
            self.data,
            self.model,
            log=self.log,
            airflow=self.airflow_run(context),
        )


class PromoteOperator(DagtrainOperator):
    """Register the evaluated model; promote it only if it beats the champion.

    What is registered, and compared, is the run's evaluation as the evaluate task kept
    it in the run's folder (its checkpoint under the pipeline's artifact root), never
    the values of an XCom.

    Every challenger becomes a registry version (metrics, lineage to the config, the
    data manifest and the run); only a better one becomes the champion, and only then
    does the task succeed and emit its ``outlets`` (the model's Asset). A model that is
    not better leaves the task *skipped*: no model event, the champion unchanged.
    """

    template_fields = ("evaluation",)

    def __init__(self, *, evaluation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation

    @fails_fast_on_bad_input
    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from dagtrain.phases.registry import evaluation_of, promote

        cfg = self.run_config(context)
        # the run's own evaluation file, not the XCom (``evaluation``: the dependency
        # on the evaluate task), which a user who may trigger runs can rewrite
        ev = evaluation_of(cfg, context["run_id"])
        told = self.evaluation if isinstance(self.evaluation, dict) else {}
        if told and told.get("metrics") != ev.metrics:
            self.log.warning(
                "the evaluate task's XCom differs from its evaluation file: the file decides"
            )
        lineage = {
            "dag_id": context["dag"].dag_id if context.get("dag") else None,
            "run_id": context["run_id"],
            "config": self.config_path,
            "config_values": cfg.shown(),
            "data_manifest": ev.manifest,
            "data_version": ev.data_version,
            "checkpoint": ev.checkpoint,
        }
        entry = promote(
            cfg,
            ev.checkpoint,
            ev.metrics,
            lineage,
            log=self.log,
            airflow=self.airflow_run(context),
        )
        self.log.info("registered v%d: %s", entry["version"], entry["reason"])
        if not entry["promoted"]:  # a skipped task has no XCom: the message says it all
            t = entry.get("tracking") or {"ok": True}
            mlflow = "" if t["ok"] else f"; MLflow ({t['connection']!r}) failed: {t['error']}"
            raise AirflowSkipException(f"not promoted: {entry['reason']}{mlflow}")
        for outlet in self.outlets or []:
            context["outlet_events"][outlet].extra.update(
                {"version": entry["version"], "path": entry["path"], **ev.metrics}
            )
        keys = ("version", "path", "sha256", "metrics", "reason", "tracking")
        return {k: entry[k] for k in keys if k in entry}
