"""A small client of a running Airflow 3's REST API: log in, trigger a run, follow it.

``POST /auth/token`` (the simple auth manager's login) gives a JWT; runs are triggered
with ``POST /api/v2/dags/{dag_id}/dagRuns`` and followed with ``GET`` on the run and its
task instances. Every failure becomes a RestError that says what to do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["Client", "RestError", "detail"]

FINISHED = {"success", "failed"}


class RestError(RuntimeError):
    """A REST call failed; the message says why and what to try."""


def detail(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text.strip()[:500]
    d = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(d, list):  # FastAPI validation errors
        return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', []))}: {e.get('msg')}" for e in d)
    return d if isinstance(d, str) else str(d)


class Client:
    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self.password = password
        self.http = httpx.Client(base_url=self.url, timeout=timeout)
        self.token: str | None = None

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(kw.pop("headers", {}))
        try:
            return self.http.request(method, path, headers=headers, **kw)
        except httpx.ConnectError:
            raise RestError(
                f"cannot reach Airflow at {self.url}: is it running (`dagtrain up`)? check --url"
            ) from None
        except httpx.TimeoutException:
            raise RestError(f"Airflow at {self.url} did not answer in time") from None

    def login(self) -> None:
        r = self._send(
            "POST", "/auth/token", json={"username": self.user, "password": self.password}
        )
        if r.status_code in (401, 403):
            raise RestError(
                f"Airflow at {self.url} refused the credentials of user {self.user!r} "
                f"({r.status_code}: {detail(r)}); check --user/--password "
                "(dagtrain up prints them)"
            )
        if r.status_code == 404:
            raise RestError(f"{self.url} has no /auth/token: is it an Airflow 3 api-server?")
        if r.status_code >= 400:
            raise RestError(f"login failed ({r.status_code}): {detail(r)}")
        self.token = r.json()["access_token"]

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
        if self.token is None:
            self.login()
        r = self._send(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        if r.status_code == 404:
            raise RestError(
                f"no DAG {dag_id!r} on {self.url} (is its file in the DAGs folder, and parsed?)"
            )
        if r.status_code in (400, 422):
            # the first lines say which param and why; the schema Airflow appends is noise
            why = detail(r).split("\n\nFailed validating")[0].strip()
            raise RestError(f"Airflow refused the run's conf: {why}")
        if r.status_code in (401, 403):
            raise RestError(f"user {self.user!r} may not trigger {dag_id!r}: {detail(r)}")
        if r.status_code >= 400:
            raise RestError(f"triggering {dag_id!r} failed ({r.status_code}): {detail(r)}")
        return r.json()

    def unpause(self, dag_id: str) -> dict[str, Any] | None:
        """Unpause the DAG if it is paused (new DAGs are); the DAG (as the API describes
        it) if it was paused, else None."""
        r = self._send("GET", f"/api/v2/dags/{dag_id}")
        if r.status_code == 404:
            raise RestError(
                f"no DAG {dag_id!r} on {self.url} (is its file in the DAGs folder, and parsed?)"
            )
        if r.status_code >= 400:
            raise RestError(f"reading DAG {dag_id!r} failed ({r.status_code}): {detail(r)}")
        dag = r.json()
        if not dag.get("is_paused"):
            return None
        r = self._send("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
        if r.status_code >= 400:
            raise RestError(f"unpausing {dag_id!r} failed ({r.status_code}): {detail(r)}")
        return dag

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        r = self._send("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        if r.status_code >= 400:
            raise RestError(f"reading run {run_id!r} failed ({r.status_code}): {detail(r)}")
        return r.json()

    def tasks(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's tasks (``task_id``, ``downstream_task_ids``, ``is_mapped`` ...)."""
        r = self._send("GET", f"/api/v2/dags/{dag_id}/tasks")
        return r.json().get("tasks", []) if r.status_code < 400 else []

    def params(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's Params as values (``{name: value}``), or None if it has none."""
        r = self._send("GET", f"/api/v2/dags/{dag_id}/details")
        if r.status_code >= 400:
            return None
        params = r.json().get("params") or {}
        return {k: v.get("value") if isinstance(v, dict) else v for k, v in params.items()}

    def progress(self, dag_id: str, run_id: str, after: float) -> list[dict[str, Any]] | None:
        """The training tasks' progress lines since ``after``, from the dagtrain plugin's
        API; None when the server has no such plugin."""
        r = self._send(
            "GET", f"/dagtrain/api/dags/{dag_id}/runs/{run_id}/progress", params={"after": after}
        )
        if r.status_code == 404 and "no dagtrain pipeline" not in r.text:
            return None
        return r.json().get("lines", []) if r.status_code < 400 else []

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        r = self._send("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        if r.status_code >= 400:
            return []
        return r.json().get("task_instances", [])

    def error_of(self, dag_id: str, run_id: str, ti: dict[str, Any]) -> str | None:
        """The error a failed task instance's try ended with, from its log as the API
        serves it (structured: the exception's type and message), or None."""
        r = self._send(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
            f"{ti.get('try_number') or 1}",
            params={"map_index": ti.get("map_index", -1), "full_content": True},
            headers={"Accept": "application/json"},
        )
        if r.status_code >= 400:
            return None
        content = r.json().get("content") or []
        for entry in reversed([c for c in content if isinstance(c, dict)]):
            for detail in reversed(entry.get("error_detail") or []):
                if isinstance(detail, dict) and detail.get("exc_type"):
                    return f"{detail['exc_type']}: {detail.get('exc_value', '')}".strip()
        for entry in reversed([c for c in content if isinstance(c, dict)]):
            if entry.get("level") == "error":
                return str(entry.get("event"))
        return None

    def xcom(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> Any:
        """The ``return_value`` XCom of a task instance, or None if it has none."""
        r = self._send(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/"
            "return_value",
            params={"map_index": map_index},
        )
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise RestError(f"reading {task_id}'s XCom failed ({r.status_code}): {detail(r)}")
        value = r.json().get("value")
        if isinstance(value, str):  # stored as JSON text
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    def wait(
        self,
        dag_id: str,
        run_id: str,
        timeout: float | None = None,
        on_poll: Callable[[dict, list], None] | None = None,
        every: float = 2.0,
    ) -> dict[str, Any]:
        """Poll until the run finishes; return it. TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if on_poll:
                on_poll(run, self.task_instances(dag_id, run_id))
            if run.get("state") in FINISHED:
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} of {dag_id} still {run.get('state')}")
            time.sleep(every)
