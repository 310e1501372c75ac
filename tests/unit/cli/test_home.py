"""The embedded home (``dagtrain.cli.embedded.Home``): only its owner may enter it, and
its secrets are the owner's from their first byte."""

from __future__ import annotations

import os
import stat

from dagtrain.cli.embedded import Home


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_home_is_its_owners_and_its_secrets_are_never_readable_by_others(tmp_path):
    # what activate() makes before it sets the environment (in this process, where other
    # tests may have imported airflow, activate() itself refuses to run)
    old = os.umask(0o022)  # the usual default: new files readable by everyone
    try:
        h = Home(tmp_path / "proj" / ".dagtrain", tmp_path / "dags")
        env = h.environment()
        h.make()
    finally:
        os.umask(old)
    for d in (h.root, h.airflow, h.logs):
        assert mode(d) == 0o700, (d, oct(mode(d)))
    secrets = [h.passwords, h.airflow / ".jwt_secret", h.airflow / ".api_secret"]
    for f in secrets:
        assert mode(f) == 0o600, (f, oct(mode(f)))
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == (h.airflow / ".jwt_secret").read_text()
    assert h.password() == h.password()  # made once, then read
