"""Airflow's simple auth manager, except that the user ``outsider`` (a viewer) may not
read the DAG ``dagtrain_tiny``: what a per-DAG role of a real auth manager does."""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER = "outsider"
HIDDEN = {"dagtrain_tiny"}


class RestrictedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if user.get_name() == OUTSIDER and (details is None or details.id in HIDDEN):
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
