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
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from .common import ConfigArg, HomeOpt, Sets, fail, load, out, preflight
from .logs import logs
from .run import run
from .server import trigger, up

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # a docstring's lines are joined into paragraphs and wrapped to the terminal, not
    # kept where the source breaks them (rich mode left "Ctrl-C" alone on a line)
    rich_markup_mode="markdown",
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
def validate(config: ConfigArg, sets: Sets = None, home: HomeOpt = Path(".dagtrain")) -> None:
    """Check a config and what a run would fail on at once, running nothing.

    The fields (and --set overrides), the data (its file, reader and labels), the
    backend's library, the model (its factory imported as the ranks would, built with
    model.args on PyTorch's meta device, a small one on the CPU), distributed.device,
    and the connections the tasks will read (an object-storage data.source's object
    through data.connection, tracking.connection)."""
    _, _, eff = load(config, sets)
    preflight(eff, home)
    _reach(eff, home)
    out.print(
        Text.assemble(
            ("ok", "green"),
            f" {config}: pipeline ",
            (eff.name, "bold"),
            f" ({eff.pipeline}), model {eff.model.name}"
            + (f" ({eff.objective.name})" if eff.objective.name != "classification" else "")
            + f", {eff.distributed.ranks} "
            f"{eff.distributed.backend} rank(s)"
            + (
                f" ({eff.parallel.stages} pipeline stages x {eff.replicas} replica(s), "
                f"{eff.parallel.microbatches} microbatches, "
                + (f"{eff.parallel.chunks} chunks a rank, " if eff.parallel.chunks > 1 else "")
                + ("placed in a V, " if eff.parallel.placement == "v" else "")
                + f"order {eff.parallel.order})"
                if eff.parallel.stages > 1
                else ""
            )
            + f", {eff.training.epochs} epoch(s); artifacts in "
            f"{eff.artifact_root(home)}",  # as `dagtrain run --home` would
        )
    )


def _reach(eff: Any, home: Path) -> None:
    """What the run's tasks will read from outside: ``data.connection`` and the object
    an object-storage ``data.source`` names (through it), ``tracking.connection``. The
    connections are Airflow's as ``dagtrain run`` sees them: the home's (when it has a
    database) and ``AIRFLOW_CONN_*``. Exits 2 naming the field."""
    import os
    import shutil
    import tempfile

    from dagtrain.errors import InputError, MissingDependency
    from dagtrain.phases.sources import reach_url, source_kind

    if not (eff.tracking or source_kind(eff) == "url"):
        return
    from .common import home_of

    h = home_of(home)
    scratch = None
    if "airflow" not in sys.modules:
        if h.db.exists():
            h.activate()  # its connections, as `dagtrain run` reads them
        else:  # no home yet: AIRFLOW_CONN_* only (and nothing written into one)
            scratch = tempfile.mkdtemp(prefix="dagtrain-validate-")
            os.environ["AIRFLOW_HOME"] = scratch
    try:
        from dagtrain.tracking import check_tracking

        reach_url(eff)
        check_tracking(eff)
    except (InputError, MissingDependency) as e:
        raise fail(str(e), 2) from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


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
app.command()(logs)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C: the shell's exit code, and no traceback
        sys.stderr.write("\n")
        raise SystemExit(130) from None
    except SystemExit as e:
        if "airflow" in sys.modules:  # a command that ran Airflow in this process
            from .embedded import end_now

            end_now(e.code)
        raise


if __name__ == "__main__":
    main()
