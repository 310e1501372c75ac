"""File names, each declared once: a template that builds a name and recognises one.

``Name("ckpt-{step:08d}.pt")`` builds ``ckpt-00000120.pt`` from ``step=120`` and reads
``{"step": 120}`` back from it; every number field is an integer, every other field a
name without a slash. The names here are those the lower layers write inside a folder
they are given (a checkpoint folder, a trace folder, a job's status folder); the layout
of a pipeline's artifacts, which places those folders, is
``dagtrain.records.layout.ArtifactLayout``. Standard library only: a base module.
"""

from __future__ import annotations

import re
import string
from typing import Any

__all__ = [
    "CHECKPOINT",
    "EPOCH_TRACE",
    "LAST_TRACE",
    "MLFLOW_PENDING",
    "MLFLOW_RECORD",
    "RANK_RECORD",
    "SHARD",
    "SIDECAR",
    "TENSORS",
    "Name",
]


class Name:
    """One kind of file name: ``name(**fields)`` builds it, ``match(text)`` reads its
    fields back (None when ``text`` is not one)."""

    __slots__ = ("_fields", "_regex", "template")

    def __init__(self, template: str) -> None:
        self.template = template
        pattern, fields = "", []
        for literal, field, spec, _ in string.Formatter().parse(template):
            pattern += re.escape(literal)
            if field is None:
                continue
            numeric = bool(spec) and spec[-1] in "dx"
            pattern += rf"(?P<{field}>\d+)" if numeric else rf"(?P<{field}>[^/]+?)"
            fields.append((field, numeric))
        self._regex = re.compile(rf"^{pattern}$")
        self._fields = tuple(fields)

    def __call__(self, **fields: Any) -> str:
        return self.template.format(**fields)

    def match(self, text: str) -> dict[str, Any] | None:
        m = self._regex.match(text)
        if m is None:
            return None
        return {f: int(m[f]) if numeric else m[f] for f, numeric in self._fields}

    def __repr__(self) -> str:
        return f"Name({self.template!r})"


# a checkpoint of a training run (and a round's global model), with its sidecar
# (``SIDECAR(name=...)``: size and sha256) beside it
CHECKPOINT = Name("ckpt-{step:08d}.pt")
# a pipeline's checkpoint: stage 0's part is CHECKPOINT's file, which lists the others,
# each stage's written by that stage's first replica (``SIDECAR`` beside each too)
SHARD = Name("ckpt-{step:08d}.stage{stage:d}.pt")
SIDECAR = Name("{name}.json")
# the tensors of a pipeline stage's part (stage 0's too): a torch.distributed.checkpoint
# folder (DCP's own format), which that part's file (whose sidecar holds their
# checksums) stands for
TENSORS = Name("ckpt-{step:08d}.stage{stage:d}.dcp")
# a rank's trace of a step: the run's last step, and each epoch's last (step counted
# from 1)
LAST_TRACE = Name("step-rank{rank:d}.json")
EPOCH_TRACE = Name("step{step:07d}-rank{rank:d}.json")
# a rank's own record in its job's status folder: where it runs, how far it is, why it
# stopped
RANK_RECORD = Name("rank{rank:d}.json")
# what the phases record of MLflow (dagtrain.tracking): a run's record (runs/<run>/) and
# the registry's (registry/), and a run's logging still to do (the server was down)
MLFLOW_RECORD = "mlflow.json"
MLFLOW_PENDING = "mlflow-pending.json"
