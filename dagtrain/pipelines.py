"""DAGs built from a pipeline config file: what the example DAG files in ``dags/`` call.

``retraining_dag(yaml)``: prepare_data -> train -> evaluate -> promote, scheduled by
``schedule.cron`` (``catchup=False``, ``max_active_runs=1``) or, when ``schedule.asset``
is set, whenever that Asset is updated. ``rounds_dag(yaml)``: prepare_data, then for
each of ``rounds.rounds`` rounds a training task mapped over the ``rounds.shards`` shards
(the DAG's shape, so a run's conf cannot change either), closed by a
RoundAveragingOperator; then evaluate and promote.

Parsing stays cheap: the config is read and validated (pydantic, yaml), nothing else;
torch, Horovod and MPI are imported by the tasks when they run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset

from dagtrain.config import PipelineConfig, dag_params, load_config
from dagtrain.operators import (
    DataPrepOperator,
    DistributedTrainOperator,
    EvaluateOperator,
    PromoteOperator,
    RoundAveragingOperator,
)
from dagtrain.records.layout import (
    EVALUATE_TASK,
    PREPARE_TASK,
    PROMOTE_TASK,
    TRAIN_TASK,
    ArtifactLayout,
    round_sync_task,
    round_train_task,
)

__all__ = ["data_asset", "model_asset", "retraining_dag", "rounds_dag"]

START = datetime(2026, 1, 1, tzinfo=UTC)


def data_asset(cfg: PipelineConfig) -> Asset:
    return Asset(name=f"dagtrain.{cfg.name}.data", uri=ArtifactLayout.of(cfg).data_root.as_uri())


def model_asset(cfg: PipelineConfig) -> Asset:
    return Asset(name=f"dagtrain.{cfg.name}.model", uri=ArtifactLayout.of(cfg).registry.as_uri())


def _schedule(cfg: PipelineConfig):
    if cfg.schedule.asset:
        a = cfg.schedule.asset
        return Asset(name=a, uri=a) if "://" in a else Asset(name=a)
    return cfg.schedule.cron


def _dag(cfg: PipelineConfig, path: Path, dag_id: str | None, kind: str) -> DAG:
    t = cfg.training
    return DAG(
        dag_id or cfg.dag_id,
        description=f"dagtrain {kind}: {cfg.model.name} on {cfg.shown()['data']['source']} "
        f"({cfg.distributed.ranks} {cfg.distributed.backend} ranks)",
        schedule=_schedule(cfg),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        params=dag_params(cfg),
        default_args={
            "retries": t.retries,
            "retry_delay": timedelta(seconds=t.retry_delay_seconds),
        },
        tags=["dagtrain", kind],
        doc_md=f"Built by dagtrain from `{path.name}`. Trigger with a conf of config "
        "sections (validated against the config's schema), e.g. "
        '`{"training": {"epochs": 3}}`.',
    )


def _timeout(cfg: PipelineConfig) -> timedelta | None:
    m = cfg.training.timeout_minutes
    return timedelta(minutes=m) if m else None


def retraining_dag(config: str | Path, dag_id: str | None = None) -> DAG:
    path = Path(config).resolve()
    cfg = load_config(path)
    kind = "asset-retraining" if cfg.schedule.asset else "retraining"
    with _dag(cfg, path, dag_id, kind) as dag:
        prep = DataPrepOperator(task_id=PREPARE_TASK, config=path, outlets=[data_asset(cfg)])
        train = DistributedTrainOperator(
            task_id=TRAIN_TASK, config=path, data=prep.output, execution_timeout=_timeout(cfg)
        )
        ev = EvaluateOperator(
            task_id=EVALUATE_TASK, config=path, data=prep.output, model=train.output
        )
        promote = PromoteOperator(
            task_id=PROMOTE_TASK, config=path, evaluation=ev.output, outlets=[model_asset(cfg)]
        )
        prep >> train >> ev >> promote
    return dag


def rounds_dag(config: str | Path, dag_id: str | None = None) -> DAG:
    path = Path(config).resolve()
    cfg = load_config(path)
    with _dag(cfg, path, dag_id, "rounds") as dag:
        prep = DataPrepOperator(
            task_id=PREPARE_TASK, config=path, for_rounds=True, outlets=[data_asset(cfg)]
        )
        last = prep
        for r in range(cfg.rounds.rounds):
            shards = DistributedTrainOperator.partial(
                task_id=round_train_task(r),
                config=path,
                data=prep.output,
                round=r,
                execution_timeout=_timeout(cfg),
            ).expand(shard=list(range(cfg.rounds.shards)))
            sync = RoundAveragingOperator(
                task_id=round_sync_task(r),
                config=path,
                data=prep.output,
                round=r,
                contributions=shards.output,
            )
            last >> shards >> sync
            last = sync
        ev = EvaluateOperator(
            task_id=EVALUATE_TASK, config=path, data=prep.output, model=last.output
        )
        promote = PromoteOperator(
            task_id=PROMOTE_TASK, config=path, evaluation=ev.output, outlets=[model_asset(cfg)]
        )
        last >> ev >> promote
    return dag
