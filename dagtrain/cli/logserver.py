"""Airflow's log server for ``dagtrain up``, on the address the home serves its UI on.

Airflow 3.3's own (``airflow scheduler`` and ``airflow triggerer`` start one each)
listens on every interface: ``airflow.utils.serve_logs.core`` passes ``host=""`` to
uvicorn, with no setting to change it. ``dagtrain up`` starts both with
``--skip-serve-logs`` and runs the same app (``log_server.get_app``, which answers
only requests signed with the home's secret) once, here, on ``--host`` (127.0.0.1
unless the home says otherwise), serving the workers' and the triggerer's logs on the
one port after the UI's. A task's host name is then ``127.0.0.1`` for a home on the
loopback (``loopback``, Airflow's ``[core] hostname_callable``), so that the
api-server reads a running task's log where this server listens.

    python -m dagtrain.cli.logserver HOST PORT
"""

from __future__ import annotations

import sys

__all__ = ["loopback", "main"]


def loopback() -> str:
    """The host name a task of a loopback home records: where its log server listens."""
    return "127.0.0.1"


def main(argv: list[str]) -> None:
    import uvicorn

    host, port = argv
    uvicorn.run(
        "airflow.utils.serve_logs.log_server:get_app",
        factory=True,
        host=host,
        port=int(port),
        log_config=None,
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
