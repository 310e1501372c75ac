"""The login of ``dagtrain trigger`` and ``dagtrain logs --url``: one lookup for both."""

import json

import pytest
import typer
from typer.testing import CliRunner

from dagtrain.cli import app
from dagtrain.cli.common import password_of


def test_the_password_is_the_one_given_else_the_homes(tmp_path):
    (tmp_path / "airflow").mkdir()
    (tmp_path / "airflow" / "passwords.json").write_text(json.dumps({"admin": "from-up"}))
    assert password_of(tmp_path, "admin", None) == "from-up"
    assert password_of(tmp_path, "admin", "given") == "given"
    with pytest.raises(typer.Exit):  # another user has no password in the home
        password_of(tmp_path, "viewer", None)


@pytest.mark.parametrize(
    "argv",
    [
        ["trigger", "dagtrain_digits"],
        ["logs", "some_run", "--url", "http://127.0.0.1:9"],
    ],
    ids=["trigger", "logs --url"],
)
def test_no_password_anywhere_is_said_before_any_request(tmp_path, argv):
    # an unreadable passwords file is no password, not a traceback
    (tmp_path / "airflow").mkdir()
    (tmp_path / "airflow" / "passwords.json").write_text("not json")
    r = CliRunner().invoke(app, [*argv, "--home", str(tmp_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "no password: give --password (or DAGTRAIN_AIRFLOW_PASSWORD)" in r.output
