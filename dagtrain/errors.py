"""The project's own errors that no retry can mend.

``InputError``: bad input (a config, a run's conf, a data file, a model's arguments, a
shard's contribution); another try would read the same input. ``MissingDependency``:
what a config asks for is not installed here (e.g. Horovod); the message gives the
command that installs it. Airflow tasks fail at once on either, without retries
(``dagtrain.operators``); any other error is the machinery's (a rank that died, a
timeout) and is retried. Standard library only.
"""

from __future__ import annotations

__all__ = ["FAIL_FAST", "InputError", "MissingDependency"]


class InputError(ValueError):
    """Bad input: the message names the field, file, rank or shard, and what to do."""


class MissingDependency(RuntimeError):
    """A library the config asks for is not installed; the message says how to install it."""


FAIL_FAST = (InputError, MissingDependency)
