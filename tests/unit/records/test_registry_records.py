"""The model registry and a run's evaluation, typed: written and read back by one
function each; a damaged file raises, naming it (promote never rebuilds a registry from
nothing); a field a newer version wrote is kept and written back."""

from __future__ import annotations

import json

import pytest

from dagtrain.records.registry import (
    Evaluation,
    Registry,
    RegistryEntry,
    read_evaluation,
    read_registry,
    write_evaluation,
    write_registry,
)


def test_the_registry_round_trips_and_names_its_champion(tmp_path):
    path = tmp_path / "registry.json"
    assert read_registry(path) == Registry() and Registry().next_version() == 1
    first = RegistryEntry(1, "v0001/model.pt", metrics={"test_accuracy": 0.9}, promoted=True)
    second = RegistryEntry(2, "v0002/model.pt", lineage={"dag_id": "d", "run_id": "r"})
    reg = Registry(champion=1, versions=[first, second])
    write_registry(path, reg)
    back = read_registry(path)
    assert back == reg and back.champion_entry() == first and back.next_version() == 3
    assert back.entry(2).run() == ("d", "r") and back.entry(7) is None
    doc = json.loads(path.read_text())
    doc["versions"][0]["from_a_newer_version"] = True
    path.write_text(json.dumps(doc))
    again = read_registry(path)
    write_registry(path, again)
    assert json.loads(path.read_text())["versions"][0]["from_a_newer_version"] is True
    for bad in ('{"champion": 1, "vers', "[]", '{"versions": [{"version": "3", "path": "x"}]}'):
        path.write_text(bad)
        with pytest.raises(ValueError, match=r"registry\.json"):
            read_registry(path)


def test_an_evaluation_round_trips_and_a_foreign_file_is_none(tmp_path):
    path = tmp_path / "eval.json"
    ev = Evaluation("c.pt", {"test_accuracy": 0.97}, champion=1, better=True, reason="beats")
    write_evaluation(path, ev)
    assert read_evaluation(path) == ev
    assert read_evaluation(tmp_path / "none") is None
    path.write_text(json.dumps({"metrics": {}}))
    with pytest.raises(ValueError, match=r"eval\.json: not an evaluation"):
        read_evaluation(path)
