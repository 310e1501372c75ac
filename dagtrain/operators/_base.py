"""What every dagtrain operator shares: its config, and that run's view of it.

An operator is given the pipeline config as the path of its YAML file (as the example
DAGs do) or as a PipelineConfig. At execute time the run's ``conf`` is merged in
(``dagtrain.config.merge_conf``: author-only fields refused), so the file, the UI's
trigger form, the REST API and ``dagtrain run --set`` all mean the same thing. A config
with ``tracking`` (MLflow) is refused there, before the task does any work, when the
MLflow client is not installed or the connection does not exist.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from dagtrain.config import PipelineConfig, load_config, merge_conf
from dagtrain.errors import FAIL_FAST
from dagtrain.tracking import check_tracking

__all__ = ["BadInput", "DagtrainOperator", "fails_fast_on_bad_input"]


class BadInput(AirflowFailException, ValueError):
    """Bad input (config, conf, data, a shard's contribution) or a missing dependency:
    the task fails without retries, since another try would meet the same. ``__cause__``
    is the original error; ``shard`` is set when a shard is to blame."""

    def __init__(self, message: str, shard: int | None = None) -> None:
        super().__init__(message)
        self.shard = shard


def fails_fast_on_bad_input(execute: Callable) -> Callable:
    """Turn the project's own input errors (``dagtrain.errors.InputError``, which
    ConfigError and ShardError are, and ``MissingDependency``) raised by ``execute`` into
    BadInput (no retry). Any other error, a ValueError from torch included, keeps its
    type and is retried: it is the machinery's (a rank that died, a timeout). The
    process's ``sys.path`` is as it was afterwards (``run_config`` extends it for the
    task's own imports)."""

    @functools.wraps(execute)
    def wrapper(self, context: Any) -> Any:
        path = list(sys.path)
        try:
            return execute(self, context)
        except FAIL_FAST as e:
            raise BadInput(str(e), getattr(e, "shard", None)) from e
        finally:
            sys.path[:] = path

    return wrapper


class DagtrainOperator(BaseOperator):
    ui_color = "#e8f1fb"

    def __init__(self, *, config: str | Path | PipelineConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(config, PipelineConfig):
            self.config_path = None
            self._config = config
        else:
            self.config_path = str(Path(config).resolve())
            self._config = None

    def file_config(self) -> PipelineConfig:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def run_config(self, context: Any) -> PipelineConfig:
        """The file's config with this run's conf merged in, for this task's DAG."""
        dag_run = context.get("dag_run")
        conf = getattr(dag_run, "conf", None) or {}
        cfg = merge_conf(self.file_config(), conf)
        dag_id = getattr(context.get("dag"), "dag_id", None)
        if dag_id:  # (a test's bare context has none: the config's own DAG)
            cfg = cfg.for_dag(dag_id)
        check_tracking(cfg)  # MissingDependency / InputError: no retry
        # a model module beside the config file is importable here as on the ranks
        # (Airflow puts the DAGs folder on sys.path; a generated DAG file lives apart),
        # until execute returns (fails_fast_on_bad_input puts sys.path back)
        if cfg.base_dir and cfg.base_dir not in sys.path:
            sys.path.append(cfg.base_dir)
        return cfg

    @staticmethod
    def airflow_run(context: Any) -> dict[str, Any]:
        """What the phases tag an MLflow run with: the task's ``dag_id``, ``run_id``,
        ``try_number`` and ``page`` (the run's training page)."""
        from dagtrain.plugins.links import page_url

        dag = context.get("dag")
        dag_id = getattr(dag, "dag_id", None)
        run_id = context["run_id"]
        try:
            page = page_url(dag_id, run_id) if dag_id else None
        except ImportError:  # a worker with the Task SDK alone
            page = None
        ti = context.get("ti")
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "try_number": getattr(ti, "try_number", 1),
            "page": page,
        }

    @staticmethod
    def code_dirs(cfg: PipelineConfig, context: Any) -> tuple[str | None, ...]:
        """Where a DAG author's own modules (a model factory) live, for the processes a
        task starts (the ranks): the DAG file's folder and Airflow's plugins folder (both
        on this task's ``sys.path``, which child processes do not inherit) and the
        config file's folder."""
        dag = context.get("dag")
        fileloc = getattr(dag, "fileloc", None)
        try:
            from airflow.configuration import conf

            plugins = conf.get("core", "plugins_folder", fallback=None)
        except ImportError:  # a worker with the Task SDK alone
            plugins = None
        return (str(Path(fileloc).parent) if fileloc else None, cfg.base_dir, plugins)
