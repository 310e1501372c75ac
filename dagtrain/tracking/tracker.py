"""One phase's MLflow logging: the parts it does, the deadline on each call, and what
happens when the server is down (see the package's docstring for what is logged where).

A phase opens a Tracker (which resolves the connection: InputError for an unknown
one), calls ``begin()`` (the run's pending parts first), then ``do(part, **args)`` for
its own parts. A part is recomputed from the files the phases wrote, so doing it again
(a retry, a pending part) logs what is missing and changes nothing else: params already
there are kept, epochs whose step is logged are not logged twice, a registry version
MLflow already has is not registered twice. The first failure of a phase is logged
once as a warning naming the connection; from then on that phase makes no more calls
and its parts go to the pending file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dagtrain import redact
from dagtrain.config import PipelineConfig, dotted
from dagtrain.records import metrics
from dagtrain.records.jsonfile import read_object
from dagtrain.records.layout import RunLayout, TrainFiles
from dagtrain.records.mlflow import (
    MlflowRun,
    Pending,
    read_models,
    read_pending,
    read_run,
    write_models,
    write_pending,
    write_run,
)
from dagtrain.records.names import MLFLOW_PENDING, SIDECAR
from dagtrain.records.registry import (
    Registry,
    RegistryEntry,
    init_said,
    read_evaluation,
    read_registry,
)
from dagtrain.records.result import read_summary

from .connection import check_tracking

__all__ = ["DEADLINES", "Tracker", "init_tags"]

# every MLflow call has a deadline: a dead server costs seconds, not MLflow's default
# of 7 retries with exponential backoff (minutes); the environment may say otherwise
DEADLINES = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
}
TAG_DAG, TAG_RUN, TAG_TRY, TAG_PAGE = (
    "airflow.dag_id",
    "airflow.run_id",
    "airflow.try_number",
    "dagtrain.page",
)
TAG_VERSION, TAG_VERDICT, TAG_REASON = "dagtrain.version", "dagtrain.verdict", "dagtrain.reason"
CHAMPION = "champion"
_PARAM_VALUE_MAX = 6000
_BATCH = 100  # MLflow's log_batch takes at most 100 params or tags, 1000 metrics
_NOT_METRICS = ("kind", "epoch", "step", "total_steps", "time", "try")


def params_of(config: dict[str, Any]) -> dict[str, str]:
    """A config as MLflow params: dotted keys (``training.lr``), lists and a model's
    ``args`` as JSON, every value a string."""
    return {k: _param(v) for k, v in dotted(config).items()}


def _param(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text[:_PARAM_VALUE_MAX]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


@contextlib.contextmanager
def _deadlines() -> Iterator[None]:
    """While MLflow is called: ``DEADLINES`` in the environment (where it does not say
    otherwise), and urllib3's warning for each retry of an MLflow call to a server that
    is down dropped, beside the one warning of dagtrain's that names the connection (of
    MLflow's REST paths only). Both are as they were afterwards."""
    import logging

    added = {k: v for k, v in DEADLINES.items() if k not in os.environ}
    os.environ.update(added)
    log, quiet = logging.getLogger("urllib3.connectionpool"), _MlflowRetries()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)
        for k in added:
            os.environ.pop(k, None)


class _MlflowRetries:
    def filter(self, record: Any) -> bool:
        text = record.getMessage()
        return not (text.startswith("Retrying") and "/api/2.0/mlflow/" in text)


class Tracker:
    """A phase's MLflow logging for one DAG run (``run_dir``: its artifact folder).

    ``airflow``: ``dag_id``, ``run_id``, ``try_number`` and ``page`` (the training
    page's URL), from the task's context. ``run_dir_of(dag_id, run_id)``: the artifact
    folder of another DAG run (promote registers a champion MLflow lacks from its own
    run). ``log``: the task's logger. ``registry_lock``: the file lock of dagtrain's
    registry, held while the champion alias is set from it. Raises InputError (the connection) and
    MissingDependency (no client) on construction, before any work."""

    def __init__(
        self,
        cfg: PipelineConfig,
        run_dir: Path,
        registry_dir: Path,
        *,
        airflow: dict[str, Any] | None = None,
        run_dir_of: Callable[[str, str], Path] | None = None,
        registry_lock: Path | None = None,
        log: Any = None,
    ) -> None:
        assert cfg.tracking is not None, "a Tracker is for a pipeline with tracking"
        self.uri: str = check_tracking(cfg) or ""
        # what is recorded and shown: without a user, password or query string
        self.shown_uri = redact.url(self.uri)
        self.connection = cfg.tracking.connection
        self.experiment = cfg.tracking.experiment or cfg.name
        self.model_name = cfg.tracking.registered_model or cfg.name
        self.run_dir, self.registry_dir = Path(run_dir), Path(registry_dir)
        self.airflow = dict(airflow or {})
        self.run_dir_of = run_dir_of
        self.registry_lock = registry_lock
        self.log = log
        self.error: str | None = None
        self.failed: list[str] = []
        self._client: Any = None

    # the phase's view --------------------------------------------------------------
    def begin(self) -> None:
        """Do the parts earlier phases of the run could not (the server was down)."""
        for item in read_pending(self.run_dir):
            self.do(item.part, **item.args)

    def do(self, part: str, **args: Any) -> bool:
        """Do one part (``start``, ``train``, ``evaluate``, ``promote``); True when it was
        logged. A failure is never raised: it is logged once, and the part is kept in the
        pending file for the next phase."""
        if self.error is None:
            try:
                with _deadlines():
                    getattr(self, f"_{part}")(**args)
            except Exception as e:  # tracking never fails a task
                self._down(part, e)
            else:
                self._pending(part, args, keep=False)
                return True
        self.failed.append(part)
        self._pending(part, args, keep=True)
        return False

    def report(self) -> dict[str, Any]:
        """How tracking went in this phase (the task's XCom ``tracking``)."""
        return {
            "ok": self.error is None,
            "connection": self.connection,
            "uri": self.shown_uri,
            "experiment": self.experiment,
            "run_id": read_run(self.run_dir).run_id,
            "error": self.error,
            "pending": [i.part for i in read_pending(self.run_dir)],
        }

    def _down(self, part: str, e: BaseException) -> None:
        said = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if self.uri != self.shown_uri:  # MLflow's messages name the URLs it asked
            said = said.replace(self.uri, self.shown_uri)
        self.error = f"{type(e).__name__}: {said}"[:500]
        if self.log is not None:
            self.log.warning(
                "MLflow tracking: connection %r (%s) failed in %s: %s. Training and "
                "dagtrain's registry go on without it; what was not logged is kept in %s "
                "and retried by the run's next phase",
                self.connection,
                self.shown_uri,
                part,
                self.error,
                self.run_dir / MLFLOW_PENDING,
            )

    def _pending(self, part: str, args: dict[str, Any], keep: bool) -> None:
        item = Pending(part, args)
        items = [i for i in read_pending(self.run_dir) if i != item]
        write_pending(self.run_dir, [*items, item] if keep else items)

    # MLflow ------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        return self._client

    def _run_id(self) -> str:
        """The DAG run's MLflow run: the one its record names, or the one tagged with its
        dag_id and run_id, or a new one; recorded before anything is logged to it."""
        known = read_run(self.run_dir).at(self.shown_uri)
        if known is not None:
            return known
        c = self.client
        exp = c.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else c.create_experiment(self.experiment)
        dag_id = str(self.airflow.get("dag_id") or "")
        run_id = str(self.airflow.get("run_id") or self.run_dir.name)
        found = c.search_runs(
            [exp_id],
            filter_string=f"tags.`{TAG_DAG}` = '{_quoted(dag_id)}' and "
            f"tags.`{TAG_RUN}` = '{_quoted(run_id)}'",
            max_results=1,
        )
        if found:
            mlflow_run = found[0].info.run_id
        else:
            tags = {TAG_DAG: dag_id, TAG_RUN: run_id, "dagtrain.pipeline": self.experiment}
            mlflow_run = c.create_run(exp_id, run_name=run_id, tags=tags).info.run_id
        rec = MlflowRun(
            uri=self.shown_uri,
            connection=self.connection,
            experiment=self.experiment,
            experiment_id=str(exp_id),
            run_id=mlflow_run,
        )
        write_run(self.run_dir, rec)
        return mlflow_run

    def _tags(self, run: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items() if v is not None]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(run, tags=items[i : i + _BATCH])

    def _metrics(self, run: str, rows: list[tuple[str, float, int]]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v, step in rows]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run, metrics=items[i : i + 1000])

    # the parts -----------------------------------------------------------------------
    def _start(self, try_number: int = 1) -> None:
        """A training try begins: the run found or created, and tagged."""
        a = self.airflow
        self._tags(
            self._run_id(),
            {
                TAG_DAG: a.get("dag_id"),
                TAG_RUN: a.get("run_id"),
                TAG_TRY: try_number,
                TAG_PAGE: a.get("page"),
            },
        )

    def _train(self, train_dir: str, manifest: str | None = None) -> None:
        """The training task's params, metrics and artifacts (from its folder)."""
        from mlflow.entities import Param

        run = self._run_id()
        folder = TrainFiles(Path(train_dir))
        config = read_object(folder.config)
        result = read_summary(folder.result)
        have = self.client.get_run(run).data.params
        params = [Param(k, v) for k, v in params_of(config).items() if k not in have]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(run, params=params[i : i + _BATCH])
        logged = {m.step for m in self.client.get_metric_history(run, "epoch")}
        rows: list[tuple[str, float, int]] = []
        for e in metrics.epochs(metrics.read(folder.metrics)):
            step = int(e.get("step") or 0)
            if step in logged:
                continue
            rows.append(("epoch", float(e["epoch"]), step))
            rows += [(k, v, step) for k, v in _numbers(e) if k not in _NOT_METRICS]
        last = result.steps if result is not None else 0
        changes = result.world_changes if result is not None else []
        for k, v in (
            ("ranks", None if result is None else result.world),
            ("world_changes", len(changes)),
            ("run_samples_per_second", None if result is None else result.samples_per_second),
            ("skipped_steps", None if result is None else result.skipped_steps),
        ):
            if (n := _number(v)) is not None:
                rows.append((k, n, last))
        self._metrics(run, rows)
        self._tags(run, {"dagtrain.backend": None if result is None else result.backend})
        self._tags(run, init_tags(None if result is None else result.init))
        if folder.traces.is_dir() and any(folder.traces.iterdir()):
            self.client.log_artifacts(run, str(folder.traces), "traces")
        if folder.result.exists():
            self.client.log_artifact(run, str(folder.result), "dagtrain")
        if manifest and Path(manifest).exists():
            self.client.log_artifact(run, manifest, "data")
        if changes:
            with tempfile.TemporaryDirectory() as tmp:
                f = Path(tmp) / "world_changes.json"
                f.write_text(json.dumps(changes, indent=1, default=str))
                self.client.log_artifact(run, str(f), "dagtrain")

    def _evaluate(self, evaluation: str) -> None:
        """The test metrics (the evaluate task's output file), in the same run."""
        run = self._run_id()
        ev = read_evaluation(Path(evaluation))
        result = read_summary(RunLayout(self.run_dir).train.result)
        step = result.steps if result is not None else 0
        if ev is not None:
            self._metrics(run, [(k, v, step) for k, v in _numbers(ev.metrics)])
            self._tags(run, {"dagtrain.evaluation": ev.reason})

    def _promote(self, version: int, registry_file: str) -> None:
        """Register dagtrain's version ``version`` as an MLflow model version, then set
        the champion alias where dagtrain's registry says (``registry_file``), holding
        the registry's lock: two promotes at once leave the alias where the registry
        ends."""
        with _flocked(self.registry_lock):
            self._sync(int(version), read_registry(Path(registry_file)))

    def _sync(self, version: int, reg: Registry) -> None:
        by_version = {v.version: v for v in reg.versions}
        run = self._run_id()
        self._ensure_model()
        have = self._mlflow_versions()
        entry = by_version[int(version)]
        if str(version) not in have:
            have[str(version)] = self._register(run, entry)
        champ = reg.champion
        if champ is not None and str(champ) not in have:  # registered while MLflow was down
            other = self._run_of(by_version[champ])
            if other is not None:
                have[str(champ)] = self._register(other, by_version[champ])
        if champ is not None and str(champ) in have:
            self.client.set_registered_model_alias(self.model_name, CHAMPION, have[str(champ)])
        else:  # no champion MLflow can show: no alias rather than a wrong one
            self._drop_alias()
        models = read_models(self.registry_dir)
        models.versions.update(
            {k: {"name": self.model_name, "version": v} for k, v in have.items()}
        )
        models.uri, models.name = self.shown_uri, self.model_name
        write_models(self.registry_dir, models)
        self._tags(run, {"dagtrain.model_version": have[str(version)]})
        run_rec = read_run(self.run_dir)
        run_rec.model, run_rec.model_version = self.model_name, have[str(version)]
        write_run(self.run_dir, run_rec)
        self.client.set_terminated(run, "FINISHED")

    def _ensure_model(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.model_name)
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                raise
            self.client.create_registered_model(
                self.model_name,
                tags={"dagtrain.pipeline": self.experiment},
                description=f"dagtrain pipeline {self.experiment!r}: every challenger a "
                "version; the champion alias follows dagtrain's registry",
            )

    def _mlflow_versions(self) -> dict[str, str]:
        """{dagtrain version: MLflow version} of the registered model."""
        found = self.client.search_model_versions(f"name = '{_quoted(self.model_name)}'")
        return {mv.tags[TAG_VERSION]: str(mv.version) for mv in found if TAG_VERSION in mv.tags}

    def _register(self, run: str, entry: RegistryEntry) -> str:
        model = Path(entry.path)
        self.client.log_artifact(run, str(model), "model")
        sidecar = model.with_name(SIDECAR(name=model.name))
        if sidecar.exists():
            self.client.log_artifact(run, str(sidecar), "model")
        source = f"{self.client.get_run(run).info.artifact_uri}/model"
        mv = self.client.create_model_version(
            self.model_name,
            source,
            run_id=run,
            tags={
                TAG_VERSION: str(entry.version),
                TAG_VERDICT: "promoted" if entry.promoted else "not promoted",
                TAG_REASON: entry.reason[:5000],
                "dagtrain.sha256": entry.sha256,
                **init_tags(entry.init()),
            },
            description=f"dagtrain registry v{entry.version}: {entry.reason}",
            await_creation_for=0,
        )
        return str(mv.version)

    def _run_of(self, entry: RegistryEntry) -> str | None:
        """The MLflow run of the DAG run that registered ``entry`` (its record), if any."""
        dag_id, run_id = entry.run()
        if not dag_id or not run_id or self.run_dir_of is None:
            return None
        return read_run(self.run_dir_of(dag_id, run_id)).at(self.shown_uri)

    def _drop_alias(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.delete_registered_model_alias(self.model_name, CHAMPION)
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                raise


@contextlib.contextmanager
def _flocked(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


TAG_INIT, TAG_INIT_VERSION = "dagtrain.init", "dagtrain.init_version"


def init_tags(init: Any) -> dict[str, str]:
    """A training's start (its summary's ``init``, a registry entry's lineage) as MLflow
    tags: ``dagtrain.init`` (``champion v3``, ``file model.pt``, ``scratch``, ``scratch
    (no champion yet)``) and, from a champion, ``dagtrain.init_version``; none without a
    record."""
    said = init_said(init)
    if said is None:
        return {}
    tags = {TAG_INIT: said}
    if init.get("kind") == "champion" and init.get("version") is not None:
        tags[TAG_INIT_VERSION] = str(init["version"])
    return tags


def _numbers(d: dict[str, Any]) -> list[tuple[str, float]]:
    return [(k, n) for k, v in d.items() if (n := _number(v)) is not None]


def _quoted(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "\\'")
