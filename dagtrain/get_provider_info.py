"""What Airflow's providers manager reads (the ``apache_airflow_provider`` entry point).

The plugin is not listed here: it is registered once, as the ``airflow.plugins`` entry
point, which Airflow loads whatever ``[core] lazy_discover_providers`` says (plugins
listed here are loaded only when it is False, and then twice)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-dagtrain",
        "name": "dagtrain",
        "description": "Distributed deep-learning training (Horovod, MPI, torch.distributed) "
        "as Airflow operators, with an op-level task-graph executor inside each rank.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "dagtrain",
                "external-doc-url": "https://github.com/dagtrain/dagtrain",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "dagtrain",
                "python-modules": [
                    "dagtrain.operators.data_prep",
                    "dagtrain.operators.train",
                    "dagtrain.operators.round_averaging",
                    "dagtrain.operators.evaluate",
                ],
            }
        ],
    }
