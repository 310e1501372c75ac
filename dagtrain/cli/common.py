"""What the ``dagtrain`` commands share: the consoles, options, config loading, and the
checks a run would fail on at once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from dagtrain.config import ConfigError, PipelineConfig, load_config, merge_conf, parse_sets

__all__ = ["ConfigArg", "HomeOpt", "Sets", "err", "fail", "home_of", "load", "out", "preflight"]

out = Console(soft_wrap=True)  # soft: a long path stays one line, whole when copied
err = Console(stderr=True, soft_wrap=True)

Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="override a field: --set training.epochs=3 (repeatable)"
    ),
]
ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="a pipeline config file (YAML)")]
HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home",
        envvar="DAGTRAIN_HOME",
        help="project-local directory for Airflow's SQLite DB, logs and generated DAGs",
    ),
]


def fail(msg: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    return typer.Exit(code)


def load(
    config: Path, sets: list[str] | None
) -> tuple[PipelineConfig, dict[str, Any], PipelineConfig]:
    """(the file's config, the --set overrides as a conf, the run's config)."""
    try:
        cfg = load_config(config)
        conf = parse_sets(sets or [])
        return cfg, conf, merge_conf(cfg, conf)
    except ConfigError as e:
        raise fail(str(e), 2) from None


def preflight(cfg: PipelineConfig) -> None:
    """What a run of ``cfg`` would fail on at once, checked here and now: the data file,
    the backend's library, the model factory's module. Exits 2 naming the field."""
    import importlib.util

    from dagtrain.errors import InputError, MissingDependency
    from dagtrain.stages.files import check_source
    from dagtrain.sync import require

    try:
        check_source(cfg)
        require(cfg.distributed.backend)
    except (InputError, MissingDependency) as e:
        raise fail(str(e), 2) from None
    if ":" in cfg.model.name:
        module = cfg.model.name.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise fail(
                f"model.name {cfg.model.name!r}: no module {module!r} can be imported here "
                "(is it on PYTHONPATH, next to the DAG files?)",
                2,
            )


def home_of(home: Path, dags: Path | None = None, port: int = 8080, host: str = "127.0.0.1"):
    from .embedded import Home

    dags = dags or (Path("dags") if Path("dags").is_dir() else home / "dags")
    return Home(home.resolve(), dags.resolve(), port, host)
