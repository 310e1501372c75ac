"""What dagtrain reads of Airflow's metadata database, each query once, through its ORM
(never SQL of its own): the training page's routes, ``dagtrain run``'s progress and
stop, and ``dagtrain logs`` all call these. Airflow is imported inside each function:
a caller (the CLI) points Airflow at its home before the first query.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "asset_events",
    "dag_ids_of_run",
    "dag_run",
    "earlier_tries",
    "recent_runs",
    "return_value",
    "run_state",
    "state_text",
    "tagged_dags",
    "task_instances",
    "task_try",
]


def state_text(state: Any) -> str | None:
    """A state enum (or string) as its text; None as None."""
    return None if state is None else str(getattr(state, "value", state))


def dag_run(session: Any, dag_id: str, run_id: str) -> Any:
    """The DagRun (None: no such run)."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    return session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))


def run_state(session: Any, dag_id: str, run_id: str) -> str | None:
    """The DAG run's state (None: no such run)."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    q = select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    return state_text(session.scalar(q))


def dag_ids_of_run(session: Any, run_id: str) -> list[str]:
    """The DAGs that have a run of this id, sorted."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    return sorted(session.scalars(select(DagRun.dag_id).where(DagRun.run_id == run_id)))


def recent_runs(session: Any, dag_id: str | None, limit: int) -> list[Any]:
    """The newest DagRuns (of ``dag_id``, or of any DAG), newest first."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    q = select(DagRun).order_by(DagRun.run_after.desc()).limit(limit)
    if dag_id is not None:
        q = q.where(DagRun.dag_id == dag_id)
    return list(session.scalars(q))


def task_instances(session: Any, dag_id: str, run_id: str) -> list[Any]:
    """The run's TaskInstances (each at its current try)."""
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import select

    return list(session.scalars(select(TI).where(TI.dag_id == dag_id, TI.run_id == run_id)))


def earlier_tries(session: Any, dag_id: str, run_id: str) -> list[tuple[str, int, int]]:
    """(task_id, map_index, try_number) of every try the run's history keeps."""
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH
    from sqlalchemy import select

    q = select(TIH.task_id, TIH.map_index, TIH.try_number).where(
        TIH.dag_id == dag_id, TIH.run_id == run_id
    )
    return [(t, m, n) for t, m, n in session.execute(q)]


def task_try(
    session: Any, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
) -> Any:
    """A task's try as the api-server reads its log: the TaskInstance if it is at that
    try, else the history's record of it (None: neither), its DagRun loaded."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH
    from sqlalchemy import select
    from sqlalchemy.orm import joinedload

    for model in (TI, TIH):
        ti = session.scalar(
            select(model)
            .where(
                model.dag_id == dag_id,
                model.run_id == run_id,
                model.task_id == task_id,
                model.map_index == map_index,
                model.try_number == try_number,
            )
            .options(joinedload(model.dag_run))
        )
        if ti is not None:
            return ti
    return None


def tagged_dags(session: Any, dag_ids: Any, tag: str) -> list[Any]:
    """The DagModels among ``dag_ids`` (one id or several) that carry ``tag``, by id."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    ids = [dag_ids] if isinstance(dag_ids, str) else list(dag_ids)
    dags = session.scalars(select(DagModel).where(DagModel.dag_id.in_(ids)))
    return sorted((d for d in dags if tag in {t.name for t in d.tags}), key=lambda d: d.dag_id)


def return_value(session: Any, dag_id: str, run_id: str, task_id: str) -> Any:
    """The task's XCom ``return_value`` (None: none yet)."""
    from airflow.models.xcom import XComModel

    q = XComModel.get_many(
        run_id=run_id, key="return_value", dag_ids=dag_id, task_ids=task_id, limit=1
    )
    row = session.scalars(q).first()
    return None if row is None else XComModel.deserialize_value(row)


def asset_events(session: Any, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The Asset events this run's tasks emitted (the data version, the model)."""
    from airflow.models.asset import AssetEvent
    from sqlalchemy import select

    rows = session.scalars(
        select(AssetEvent).where(
            AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id
        )
    )
    return [
        {
            "asset_id": e.asset_id,
            "name": e.asset.name,
            "uri": e.asset.uri,
            "task_id": e.source_task_id,
            "timestamp": e.timestamp.isoformat() if e.timestamp else None,
        }
        for e in rows
    ]
