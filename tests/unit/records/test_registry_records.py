"""The model registry and a run's evaluation, typed: written and read back by one
function each; an entry without an int version is not one, an unknown field ignored."""

from __future__ import annotations

import json

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
    doc["versions"] += [{"version": "3"}, {"path": "x"}]
    doc["versions"][0]["from_a_newer_version"] = True
    path.write_text(json.dumps(doc))
    assert read_registry(path) == reg


def test_an_evaluation_round_trips_and_a_foreign_file_is_none(tmp_path):
    path = tmp_path / "eval.json"
    ev = Evaluation("c.pt", {"test_accuracy": 0.97}, champion=1, better=True, reason="beats")
    write_evaluation(path, ev)
    assert read_evaluation(path) == ev
    path.write_text(json.dumps({"metrics": {}}))
    assert read_evaluation(path) is None and read_evaluation(tmp_path / "none") is None
