"""Airflow's simple auth manager, except that the user ``outsider`` (a viewer) may not
read the DAG ``dagtrain_tiny``, and may read ``dagtrain_tiny_fail`` but not its runs:
what per-DAG roles of a real auth manager do."""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER = "outsider"
HIDDEN = {"dagtrain_tiny"}
RUNS_HIDDEN = {"dagtrain_tiny_fail"}


class RestrictedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

        if user.get_name() == OUTSIDER and (details is None or details.id in HIDDEN):
            return False
        if (
            user.get_name() == OUTSIDER
            and access_entity == DagAccessEntity.RUN
            and details is not None
            and details.id in RUNS_HIDDEN
        ):
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
