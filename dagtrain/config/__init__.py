"""The pipeline config: one pydantic model, YAML in, JSON Schema (and Airflow Params) out.

A pipeline is described once, in a YAML file beside its DAG file::

    name: digits
    data: {source: digits, val_fraction: 0.1, test_fraction: 0.2}
    model: {name: mlp, args: {hidden: [64]}}
    training: {epochs: 3, batch_size: 64, lr: 0.05}
    distributed: {backend: mpi, ranks: 2}

``load_config(path)`` reads it (``yaml.safe_load``) and validates it; errors name the
field path (``training.epochs``) and what is allowed. ``dag_params(config)`` turns the
same model's JSON Schema into the DAG's Airflow ``Params``, one per section, so the web
UI's trigger form, the REST API and ``dagtrain run --set`` are all checked by the same
schema before any task runs. ``merge_conf(config, conf)`` applies a run's ``conf``.

Fields that name code or places (a model factory's import path, the artifact root, the
hosts ranks run on) are the DAG author's: a run's conf may only repeat the file's value
(the schema pins them), so nobody who can trigger a run can make a worker import a
module of their choosing. This module imports neither torch nor airflow.
"""

from __future__ import annotations

from .files import (
    apply_sets,
    deep_merge,
    dotted,
    explain,
    load_config,
    merge_conf,
    parse_sets,
    validate,
    without_file_only,
)
from .params import config_schema, dag_params
from .pipeline import (
    HOME_VARIABLE,
    ArtifactsConfig,
    EvaluationConfig,
    PipelineConfig,
    RoundsConfig,
    ScheduleConfig,
    TrackingConfig,
)
from .schema import (
    BUILTIN_OBJECTIVES,
    BUILTIN_SOURCES,
    DATA_SUFFIXES,
    DEFAULT_LAUNCHER,
    FILE_ONLY,
    OBJECTIVE_METRICS,
    RUN_SECTIONS,
    BackendName,
    BuiltinModel,
    ConfigError,
    DataConfig,
    DistributedConfig,
    ExecutorConfig,
    Launcher,
    ModelConfig,
    ObjectiveConfig,
    ParallelConfig,
    TrainConfig,
    is_factory,
)
from .training import INIT_KINDS, EarlyStoppingConfig, TrainingConfig

__all__ = [
    "BUILTIN_OBJECTIVES",
    "BUILTIN_SOURCES",
    "DATA_SUFFIXES",
    "OBJECTIVE_METRICS",
    "DEFAULT_LAUNCHER",
    "FILE_ONLY",
    "INIT_KINDS",
    "EarlyStoppingConfig",
    "HOME_VARIABLE",
    "RUN_SECTIONS",
    "ArtifactsConfig",
    "BackendName",
    "BuiltinModel",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "EvaluationConfig",
    "TrackingConfig",
    "is_factory",
    "explain",
    "ExecutorConfig",
    "Launcher",
    "ModelConfig",
    "ObjectiveConfig",
    "ParallelConfig",
    "PipelineConfig",
    "RoundsConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrainingConfig",
    "apply_sets",
    "config_schema",
    "dag_params",
    "deep_merge",
    "dotted",
    "without_file_only",
    "load_config",
    "merge_conf",
    "parse_sets",
    "validate",
]
