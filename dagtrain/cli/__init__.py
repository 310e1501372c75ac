"""The ``dagtrain`` command, and what only it uses: the embedded Airflow home
(``embedded``) and the REST client (``rest``). See ``app`` for the commands."""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
