"""What every dagtrain operator shares: its config, and that run's view of it.

An operator is given the pipeline config as the path of its YAML file (as the example
DAGs do) or as a PipelineConfig. At execute time the run's ``conf`` is merged in
(``dagtrain.config.merge_conf``: author-only fields refused), so the file, the UI's
trigger form, the REST API and ``dagtrain run --set`` all mean the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from dagtrain.config import PipelineConfig, load_config, merge_conf

__all__ = ["DagtrainOperator"]


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
        """The file's config with this run's conf merged in."""
        dag_run = context.get("dag_run")
        conf = getattr(dag_run, "conf", None) or {}
        return merge_conf(self.file_config(), conf)

    @staticmethod
    def run_dir(cfg: PipelineConfig, context: Any) -> Path:
        from dagtrain.pipeline.files import run_dir

        return run_dir(cfg.artifact_root(), context["run_id"])

    @staticmethod
    def manifest(data: Any) -> dict[str, Any]:
        """The data manifest a DataPrepOperator returned (checked against its checksums)."""
        from dagtrain.pipeline.prep import verify_manifest

        if not isinstance(data, dict) or "manifest" not in data:
            raise ValueError(
                "data must be the output of a DataPrepOperator (its XCom: a dict with "
                f"'manifest'), got {type(data).__name__}"
            )
        return verify_manifest(Path(data["manifest"]))
