"""The ``dagtrain`` command: run, validate, trigger, up, schema.

    dagtrain run dags/digits_retraining.yaml --set training.epochs=3
    dagtrain validate dags/digits_retraining.yaml
    dagtrain up                                   # api-server, scheduler, dag-processor, triggerer
    dagtrain trigger dagtrain_digits --config dags/digits_retraining.yaml --wait

Airflow is imported only by the commands that need it, after the project's home
(``.dagtrain/``, or ``$DAGTRAIN_HOME``) has been set in the environment.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from .common import ConfigArg, Sets, load, out, preflight
from .run import run
from .server import trigger, up

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="dagtrain: distributed training pipelines on Apache Airflow 3.",
)


def _version(value: bool) -> None:
    if value:
        from dagtrain import __version__

        out.print(f"dagtrain {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    """dagtrain: distributed training pipelines on Apache Airflow 3."""


@app.command()
def validate(config: ConfigArg, sets: Sets = None) -> None:
    """Check a config and what a run would fail on at once, running nothing.

    The fields (and --set overrides), the data file, the backend's library and a model
    factory's module."""
    _, _, eff = load(config, sets)
    preflight(eff)
    out.print(
        f"[green]ok[/] {config}: pipeline [bold]{eff.name}[/] ({eff.pipeline}), model "
        f"{eff.model.name}, {eff.distributed.ranks} {eff.distributed.backend} rank(s), "
        f"{eff.training.epochs} epoch(s); artifacts in {eff.artifact_root()}",
        highlight=False,
    )


@app.command()
def schema(markdown: Annotated[bool, typer.Option(help="the config reference")] = False) -> None:
    """Print the config's JSON Schema (or, with --markdown, its reference table)."""
    from dagtrain.config import config_schema

    if not markdown:
        out.print_json(json.dumps(config_schema()))
        return
    from dagtrain.docs import config_reference

    sys.stdout.write(config_reference())


app.command()(run)
app.command()(trigger)
app.command()(up)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
