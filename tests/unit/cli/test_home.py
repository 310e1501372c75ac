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


def test_configs_of_one_file_name_in_two_folders_get_a_dag_file_each(tmp_path):
    from dagtrain.cli.embedded import dag_file_for
    from dagtrain.config import load_config

    files = []
    for folder in ("a", "b"):
        cfg = tmp_path / folder / "p.yaml"
        cfg.parent.mkdir()
        cfg.write_text(f"name: p_{folder}\n")
        files.append(dag_file_for(cfg, load_config(cfg), tmp_path / "home"))
    assert files[0] != files[1] and all(f.parent == tmp_path / "home" / "dags" for f in files)
    assert [f.name.startswith("p_") for f in files] == [True, True]
    for folder, f in zip("ab", files, strict=True):
        assert repr(str(tmp_path / folder / "p.yaml")) in f.read_text()  # its own config
    # the same config again: the same file
    again = tmp_path / "a" / "p.yaml"
    assert dag_file_for(again, load_config(again), tmp_path / "home") == files[0]
