"""What the phases record of MLflow: typed records, one writer and one reader each; a
missing or foreign file reads as empty, a field a newer version wrote is kept, a pending
list drops what is not an item."""

from __future__ import annotations

import json

from dagtrain.records.mlflow import (
    MlflowModels,
    MlflowRun,
    Pending,
    read_models,
    read_pending,
    read_run,
    write_models,
    write_pending,
    write_run,
)


def test_records_round_trip_and_tolerate_what_they_do_not_know(tmp_path):
    assert read_run(tmp_path) == MlflowRun() and read_models(tmp_path) == MlflowModels()
    rec = MlflowRun(uri="http://m:5000", experiment_id="3", run_id="abc")
    write_run(tmp_path, rec)
    assert read_run(tmp_path) == rec
    assert rec.at("http://m:5000") == "abc" and rec.at("http://other") is None
    doc = json.loads((tmp_path / "mlflow.json").read_text())
    (tmp_path / "mlflow.json").write_text(json.dumps(doc | {"newer": 1}))
    again = read_run(tmp_path)
    assert again.run_id == "abc" and again.extra == {"newer": 1}
    again.model_version = "7"  # read, changed, written back: the newer field stays
    write_run(tmp_path, again)
    assert json.loads((tmp_path / "mlflow.json").read_text())["newer"] == 1
    models = MlflowModels("http://m:5000", "digits", {"1": {"name": "digits", "version": "4"}})
    write_models(tmp_path, models)
    assert read_models(tmp_path) == models


def test_the_pending_file_goes_once_nothing_waits(tmp_path):
    items = [Pending("train", {"train_dir": "/x"}), Pending("promote", {"version": 2})]
    write_pending(tmp_path, items)
    assert read_pending(tmp_path) == items
    path = tmp_path / "mlflow-pending.json"
    path.write_text(json.dumps({"pending": [{"part": "evaluate"}, {"args": {}}, 3]}))
    assert read_pending(tmp_path) == [Pending("evaluate")]
    write_pending(tmp_path, [])
    assert not path.exists() and read_pending(tmp_path) == []
