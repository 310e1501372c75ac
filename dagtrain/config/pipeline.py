"""A pipeline's config (a YAML file): the run's sections (:mod:`.schema`) and the DAG's
own (data, evaluation, schedule, rounds, artifacts, tracking), with where its paths
resolve and what a training run of it receives. Pydantic only: no torch, no airflow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from dagtrain import redact

from .schema import (
    BUILTIN_SOURCES,
    RUN_SECTIONS,
    DataConfig,
    RunSections,
    Section,
    TrainConfig,
    is_factory,
)

__all__ = [
    "DEFAULT_ARTIFACTS",
    "HOME_VARIABLE",
    "MAX_LOADER_PROCESSES",
    "ArtifactsConfig",
    "EvaluationConfig",
    "PipelineConfig",
    "RoundsConfig",
    "ScheduleConfig",
    "TrackingConfig",
]


class EvaluationConfig(Section):
    """When a newly trained model replaces the champion in the registry."""

    metric: str | None = Field(
        None,
        description="the test metric that decides promotion: test_<a metric the objective "
        "reports> (test_accuracy, test_loss, test_mse, test_r2, test_perplexity, ...); not "
        "set: the objective's first (classification: test_accuracy, regression: test_mse, "
        "language_model: test_perplexity; the author's own: its first)",
    )
    mode: Literal["auto", "max", "min"] = Field(
        "auto",
        description="whether a higher (max) or lower (min) metric is better; auto: the "
        "metric's own direction, as the objective declares it",
    )
    min_improvement: float = Field(
        0.0, ge=0, le=1e6, description="a challenger must beat the champion by more than this"
    )
    threshold: float | None = Field(
        None,
        description="never promote a model whose metric is worse than this, in the "
        "metric's direction (at least it where higher is better, at most where lower is)",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "min_accuracy" in data:
            raise ValueError(
                f"evaluation.min_accuracy is gone: write evaluation.threshold: "
                f"{data['min_accuracy']} (a bound on evaluation.metric, in its direction)"
            )
        return data

    @field_validator("metric")
    @classmethod
    def _on_test(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("test_") or not v[5:].isidentifier()):
            raise ValueError(
                f"{v!r}: promotion is decided on the test split; write test_<metric> "
                "(test_accuracy, test_loss, test_mse, test_perplexity, ...)"
            )
        return v


class TrackingConfig(Section):
    """MLflow tracking and Model Registry (the [mlflow] extra): where runs, metrics and
    models are also logged (config files only; read when each task starts)."""

    connection: str = Field(
        "mlflow_default",
        description="an Airflow connection whose host is the MLflow tracking URI "
        "(http://mlflow:5000, or with its schema and port fields)",
    )
    experiment: str | None = Field(
        None, description="the MLflow experiment; not set: the pipeline's name"
    )
    registered_model: str | None = Field(
        None,
        description="the registered model promote adds versions to; not set: the pipeline's name",
    )


class ScheduleConfig(Section):
    """When Airflow retrains: on a cron, or when an Asset is updated (file only)."""

    cron: str | None = Field(None, description="cron or preset (@daily); none: manual only")
    asset: str | None = Field(
        None,
        description="retrain when this Asset is updated, instead of on cron: its name, or a "
        "URI (a value with ://)",
    )


class RoundsConfig(Section):
    """Round-based training (pipeline: rounds): shards trained apart, then averaged."""

    rounds: int = Field(3, ge=1, le=100, description="rounds of local training + sync")
    shards: int = Field(2, ge=1, le=64, description="shards trained independently per round")
    local_steps: int = Field(20, ge=1, le=10**9, description="inner steps per shard per round")
    outer_lr: float = Field(0.7, gt=0, le=1e3, description="outer SGD learning rate (DiLoCo: 0.7)")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum")


# where a pipeline's artifacts go when artifacts.root is not set: the dagtrain home's
# folder under the `dagtrain` commands (they set the variable for every process they
# start), else this, relative to the config file
HOME_VARIABLE = "DAGTRAIN_HOME"
DEFAULT_ARTIFACTS = "../.dagtrain/artifacts"


class ArtifactsConfig(Section):
    """Where the pipeline's data, checkpoints, traces and registry go (file only)."""

    root: str | None = Field(
        None,
        description="where data, checkpoints, traces and the model registry go, relative "
        "to the config file (config files only). Not set: the dagtrain home's artifacts "
        "folder under `dagtrain run`/`up` (<home>/artifacts, so --home holds them), else "
        f"{DEFAULT_ARTIFACTS} relative to the config file",
    )


MAX_LOADER_PROCESSES = 512  # data.workers x distributed.ranks


class PipelineConfig(RunSections):
    """A training pipeline: data prep, distributed training, evaluation, promotion."""

    name: str = Field("digits", pattern=r"^[A-Za-z0-9_.-]+$", description="pipeline name")
    pipeline: Literal["retraining", "rounds"] = Field(
        "retraining",
        description="the DAG a bare config gets from `dagtrain run`: prep -> train -> "
        "evaluate -> promote, or round-based training",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    rounds: RoundsConfig = Field(default_factory=RoundsConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    tracking: TrackingConfig | None = Field(
        None, description="MLflow tracking (the [mlflow] extra); not set: dagtrain's own only"
    )
    # where the file was read from: relative paths resolve against it (not a field of
    # the file, never part of the schema)
    _base_dir: str | None = PrivateAttr(None)
    # the DAG whose run this config is for (``for_dag``): its runs' folders are its own
    _dag_id: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _metric_reported(self) -> PipelineConfig:
        ev, reported = self.evaluation, self.objective.metrics()
        if ev.metric is None or reported is None:
            return self
        if ev.metric[5:] not in reported:
            names = ", ".join(f"test_{m}" for m in reported)
            raise ValueError(
                f"evaluation.metric {ev.metric!r}: objective {self.objective.name!r} does "
                f"not report it; it reports {names}"
            )
        return self

    @model_validator(mode="after")
    def _rounds_recipe(self) -> PipelineConfig:
        if self.pipeline != "rounds":
            return self
        t = self.training
        if t.init != "scratch":
            raise ValueError(
                f"training.init {t.init!r}: a rounds pipeline starts round 0 from its seeded "
                "initialisation, not from a champion or a model file; set training.init: "
                "scratch (or use pipeline: retraining)"
            )
        if t.warmup_steps >= self.rounds.local_steps:
            raise ValueError(
                f"training.warmup_steps {t.warmup_steps} is not shorter than a shard's "
                f"training in a round (rounds.local_steps {self.rounds.local_steps} a round, "
                "the run the schedule spans): warm up for fewer steps, or use warmup_ratio"
            )
        if t.early_stopping is not None:
            raise ValueError(
                "training.early_stopping: a rounds pipeline's shards train "
                "rounds.local_steps each round and the rounds decide when it ends; leave "
                "early_stopping out (or use pipeline: retraining)"
            )
        return self

    @property
    def promotion_metric(self) -> str:
        """``evaluation.metric``, or the objective's first metric on the test split (the
        author's own objective's is known on the workers: ``test_loss`` here)."""
        if self.evaluation.metric is not None:
            return self.evaluation.metric
        reported = self.objective.metrics()
        return f"test_{next(iter(reported))}" if reported else "test_loss"

    @model_validator(mode="after")
    def _processes_bounded(self) -> PipelineConfig:
        # every rank starts data.workers DataLoader processes: bounded together, so that
        # no conf starts thousands of processes on the workers (ranks 256 x workers 64)
        n = self.distributed.ranks * self.data.workers
        if n > MAX_LOADER_PROCESSES:
            raise ValueError(
                f"data.workers {self.data.workers} with distributed.ranks "
                f"{self.distributed.ranks} start {n} DataLoader processes, more than "
                f"{MAX_LOADER_PROCESSES}: lower data.workers (0 reads in each rank)"
            )
        return self

    @property
    def base_dir(self) -> str | None:
        return self._base_dir

    @base_dir.setter
    def base_dir(self, value: str | None) -> None:
        self._base_dir = value

    @property
    def dag_id(self) -> str:
        """The DAG this config's runs belong to: the one ``for_dag`` named (a task's,
        ``dagtrain run``'s), else the DAG a bare config gets, ``dagtrain_<name>``."""
        return self._dag_id or f"dagtrain_{self.name}"

    def for_dag(self, dag_id: str) -> PipelineConfig:
        """This config, for a run of DAG ``dag_id`` (one config may build several DAGs:
        each run's folder is its DAG's, ``ArtifactLayout.run``)."""
        out = self.model_copy()
        out._dag_id = dag_id
        return out

    def shown(self) -> dict[str, Any]:
        """The config's values as dagtrain records and shows them (the DAG's Params, the
        registry's lineage, the data manifest): ``data.source`` without a URL's user,
        password or query string (``dagtrain.redact``), which may grant access."""
        values = self.model_dump(mode="json")
        values["data"]["source"] = redact.url(values["data"]["source"])
        return values

    def path(self, p: str) -> Path:
        """A path of the config, resolved against the config file's folder."""
        q = Path(p).expanduser()
        if not q.is_absolute() and self.base_dir:
            q = Path(self.base_dir) / q
        return q.resolve()

    def artifact_root(self, home: str | Path | None = None) -> Path:
        """``<artifacts.root>/<name>``; without ``artifacts.root``, the dagtrain home's
        ``artifacts/`` (``home``, else ``$DAGTRAIN_HOME``), else
        ``../.dagtrain/artifacts`` beside the config file."""
        root = self.artifacts.root
        home = home or os.environ.get(HOME_VARIABLE)
        if root is None and home:
            return Path(home).resolve() / "artifacts" / self.name
        return self.path(root or DEFAULT_ARTIFACTS) / self.name

    def data_source(self) -> str:
        """``data.source`` with a path resolved against the config file; 'digits', a
        URL or a factory as it is."""
        s = self.data.source
        if s in BUILTIN_SOURCES or "://" in s or is_factory(s):
            return s
        return str(self.path(s))

    def train_config(self, **run: Any) -> TrainConfig:
        """What the ranks of a training run of this pipeline receive: its sections as
        they are, and ``run``'s files (data, eval_data, init_from, checkpoint_dir,
        trace_dir) or replaced sections."""
        sections = {s: getattr(self, s) for s in RUN_SECTIONS}
        d = self.data
        files = {
            "data_workers": d.workers,
            "sequence_length": d.sequence_length,
            "vocab_size": d.vocab_size,
        }
        return TrainConfig(**(sections | files | run))
