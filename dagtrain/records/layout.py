"""A pipeline's artifact files: their layout, declared once, and how they are written.

``ArtifactLayout(root)`` names every file and folder under a pipeline's artifact root,
and ``RunLayout`` / ``TrainFiles`` / ``DataFiles`` those of one run, one training task
(the run's ``train/`` or a round's shard) and one prepared data version; the phases, the
operators, the CLI and the training page find every file through them, and
``ArtifactLayout.describe`` names what any path under the root is::

    <root>/                              ArtifactLayout(root)
      data/<version>/                    .data(version) -> DataFiles
        train.npz val.npz test.npz       .split(name)
        shard-00.npz ...                 .split(shard_split(k))
        stats.npz manifest.json          .stats .manifest
      runs/<dag>/<run>/                  .run(run_id) -> RunLayout (the DAG's id and the
                                         run's, each safe_name'd: one DAG's runs never
                                         share a folder with another's)
        train/                           .train -> TrainFiles
          config.json                    .config     the TrainConfig the ranks received
          result.json                    .result     rank 0's result, summarised
          metrics.jsonl                  .metrics    tries, epochs, progress (JSON lines)
          failure-try<N>.json            .failure(n) how try N failed
          checkpoints/ckpt-<step>.pt(.json)  .checkpoints
          traces/step[<S>]-rank<N>.json  .traces
          ranks/rank<N>.json             .ranks      each rank's record
        eval.json                        .evaluation
        rounds/                          (round-based pipelines)
          global/ckpt-<round>.pt(.json)  .global_checkpoint(r)
          round-<r>/global.json          .round_result(r)
          round-<r>/shard-<k>/           .shard(r, k) -> TrainFiles, plus
            delta.pt delta.pt.json       .delta .delta_sidecar
      registry/                          .registry
        registry.json .lock              .registry_file .registry_lock
        models/v<NNNN>/model.pt(.json)   .model(version)

The names inside the training layer's folders (checkpoints, traces, rank records) are
``dagtrain.records.names``'; everything is written to a temporary name, fsynced and renamed, so
a reader sees a whole file or none. No torch here: operators use it at parse time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from dagtrain.atomic import atomic_write
from dagtrain.config import PipelineConfig

from .jsonfile import read_json, write_json
from .names import (
    CHECKPOINT,
    EPOCH_TRACE,
    LAST_TRACE,
    MLFLOW_PENDING,
    MLFLOW_RECORD,
    RANK_RECORD,
    SHARD,
    SIDECAR,
    TENSORS,
    Name,
)

__all__ = [
    "PREPARE_TASK",
    "TRAIN_TASK",
    "EVALUATE_TASK",
    "PROMOTE_TASK",
    "ArtifactLayout",
    "DataFiles",
    "RunLayout",
    "TrainFiles",
    "atomic_write",
    "read_json",
    "round_sync_task",
    "round_train_task",
    "safe_name",
    "sha256_file",
    "shard_split",
    "write_json",
]

# the task ids the phases and the tools look each other up by
PREPARE_TASK = "prepare_data"
TRAIN_TASK = "train"
EVALUATE_TASK = "evaluate"
PROMOTE_TASK = "promote"
_ROUND_TRAIN = Name("round_{round:d}_train")
_ROUND_SYNC = Name("round_{round:d}_sync")


def round_train_task(r: int) -> str:
    """The (mapped) training task of round ``r`` of a round-based pipeline."""
    return _ROUND_TRAIN(round=r)


def round_sync_task(r: int) -> str:
    """The averaging task that closes round ``r``."""
    return _ROUND_SYNC(round=r)


_SPLIT = Name("{split}.npz")
_SHARD_SPLIT = Name("shard-{shard:02d}")


def shard_split(k: int) -> str:
    """The prepared split of training shard ``k`` (``shard-03``)."""
    return _SHARD_SPLIT(shard=k)


@dataclass(frozen=True)
class DataFiles:
    """One prepared data version's folder."""

    dir: Path

    def split(self, name: str) -> Path:
        """A split's arrays: ``train``, ``val``, ``test``, or ``shard_split(k)``."""
        return self.dir / _SPLIT(split=name)

    @property
    def stats(self) -> Path:  # the train split's mean and std
        return self.dir / "stats.npz"

    @property
    def manifest(self) -> Path:  # written last: its files, their checksums
        return self.dir / "manifest.json"


@dataclass(frozen=True)
class TrainFiles:
    """One training task's folder: a run's ``train/``, or a round's ``shard-<k>/``."""

    dir: Path

    @property
    def config(self) -> Path:  # the TrainConfig its ranks received
        return self.dir / "config.json"

    @property
    def result(self) -> Path:  # rank 0's result, summarised (the task's XCom)
        return self.dir / "result.json"

    @property
    def metrics(self) -> Path:  # JSON lines: each try, the start, every epoch, the end
        return self.dir / "metrics.jsonl"

    @property
    def init(self) -> Path:  # where the initial weights came from (training.init), kept
        return self.dir / "init.json"  # by the first try for its retries

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def traces(self) -> Path:
        return self.dir / "traces"

    @property
    def ranks(self) -> Path:  # the job's status folder: each rank's record
        return self.dir / "ranks"

    def failure(self, try_number: int) -> Path:
        """How try ``try_number`` failed (a RankFailure's fields)."""
        return self.dir / _FAILURE(try_number=int(try_number))

    def failures(self) -> dict[int, Path]:
        """{try: its failure record} of the tries that left one."""
        found = {}
        if self.dir.is_dir():
            for f in self.dir.iterdir():
                if (m := _FAILURE.match(f.name)) is not None:
                    found[m["try_number"]] = f
        return dict(sorted(found.items()))

    def rank_records(self) -> dict[int, Path]:
        """{rank: its record} in the status folder."""
        return _numbered(self.ranks, RANK_RECORD, "rank")

    def trace_files(self) -> dict[int | None, dict[int, Path]]:
        """{step (None: the run's last): {rank: file}} of the traced steps."""
        out: dict[int | None, dict[int, Path]] = {}
        if self.traces.is_dir():
            for f in sorted(self.traces.iterdir()):
                if (m := LAST_TRACE.match(f.name)) is not None:
                    out.setdefault(None, {})[m["rank"]] = f
                elif (m := EPOCH_TRACE.match(f.name)) is not None:
                    out.setdefault(m["step"], {})[m["rank"]] = f
        return out

    # a round's shard: its contribution to the round
    @property
    def delta(self) -> Path:  # the pseudo-gradient, global - local
        return self.dir / "delta.pt"

    @property
    def delta_sidecar(self) -> Path:  # its sha256, shapes, base model digest
        return self.dir / SIDECAR(name="delta.pt")


_FAILURE = Name("failure-try{try_number:d}.json")
_ROUND_DIR = Name("round-{round:02d}")
_SHARD_DIR = Name("shard-{shard:02d}")


def _numbered(folder: Path, name: Name, field: str) -> dict[int, Path]:
    found = {}
    if folder.is_dir():
        for f in folder.iterdir():
            if (m := name.match(f.name)) is not None:
                found[m[field]] = f
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class RunLayout:
    """One DAG run's folder (``runs/<dag>/<run>/``)."""

    dir: Path

    @property
    def train(self) -> TrainFiles:
        return TrainFiles(self.dir / "train")

    @property
    def evaluation(self) -> Path:  # the evaluate task's output
        return self.dir / "eval.json"

    @property
    def rounds(self) -> Path:
        return self.dir / "rounds"

    @property
    def globals(self) -> Path:  # the global model each round starts from (checkpoints)
        return self.rounds / "global"

    def global_checkpoint(self, r: int) -> Path:
        """The global model round ``r`` starts from (r >= 1; round 0's is the seeded
        initialisation), as ``average_round`` of round r - 1 saved it."""
        return self.globals / CHECKPOINT(step=r)

    def round_dir(self, r: int) -> Path:
        return self.rounds / _ROUND_DIR(round=r)

    def round_result(self, r: int) -> Path:  # what closing round r produced
        return self.round_dir(r) / "global.json"

    def shard(self, r: int, k: int) -> TrainFiles:
        """Shard ``k``'s training folder in round ``r``."""
        return TrainFiles(self.round_dir(r) / _SHARD_DIR(shard=k))

    def round_numbers(self) -> list[int]:
        """The rounds that have a folder, in order."""
        return list(_numbered(self.rounds, _ROUND_DIR, "round"))

    def shards_of(self, r: int) -> dict[int, TrainFiles]:
        """{shard: its folder} of round ``r``'s shards that have one."""
        return {
            k: TrainFiles(d) for k, d in _numbered(self.round_dir(r), _SHARD_DIR, "shard").items()
        }

    @staticmethod
    def task_of(path: str | Path) -> tuple[str, int]:
        """(task id, map index) of the training task whose folder holds ``path`` (a
        path inside a run's folder, relative or not): ``("train", -1)``, or a round's
        shard (``rounds/round-01/shard-00/metrics.jsonl``: ``("round_1_train", 0)``)."""
        parts = Path(path).parts
        for i in range(len(parts) - 1):
            r, k = _ROUND_DIR.match(parts[i]), _SHARD_DIR.match(parts[i + 1])
            if r is not None and k is not None:
                return round_train_task(r["round"]), k["shard"]
        return TRAIN_TASK, -1

    def training_folders(self) -> list[TrainFiles]:
        """Every training task's folder of the run: ``train/``, then each round's shards."""
        out = [self.train]
        for r in self.round_numbers():
            out += self.shards_of(r).values()
        return out


@dataclass(frozen=True)
class ArtifactLayout:
    """A pipeline's artifact root (``artifacts.root``/``<pipeline>``), seen from the DAG
    ``dag_id`` (whose runs ``run`` finds; the data and the registry are the pipeline's,
    shared by every DAG built from its config)."""

    root: Path
    dag_id: str | None = None

    @classmethod
    def of(cls, cfg: PipelineConfig) -> ArtifactLayout:
        return cls(cfg.artifact_root(), cfg.dag_id)

    @classmethod
    def of_data_root(cls, data_root: str | Path) -> ArtifactLayout:
        """The layout whose ``data_root`` is ``data_root`` (the data Asset's folder)."""
        return cls(Path(data_root).resolve().parent)

    @property
    def data_root(self) -> Path:
        return self.root / "data"

    def data(self, version: str) -> DataFiles:
        return DataFiles(self.data_root / version)

    @property
    def sources(self) -> Path:  # object-storage sources, copied (data.source a URL)
        return self.data_root / "sources"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run(self, run_id: str) -> RunLayout:
        """Run ``run_id`` of the layout's DAG: its folder, the DAG's id and the run's each
        made one safe path component (injectively: no two runs share a folder)."""
        if self.dag_id is None:
            raise ValueError("a run's folder is its DAG's: ArtifactLayout(root, dag_id)")
        return RunLayout(self.runs / safe_name(self.dag_id) / safe_name(run_id))

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def registry_file(self) -> Path:  # versions, lineage, the champion
        return self.registry / "registry.json"

    @property
    def registry_lock(self) -> Path:  # held while the registry is read and rewritten
        return self.registry / ".lock"

    def model(self, version: int) -> Path:
        """A registered version's model state (``models/v0003/model.pt``)."""
        return self.registry / "models" / _MODEL_DIR(version=version) / "model.pt"

    def describe(self, path: str | Path) -> str | None:
        """What ``path`` (a file under the root) is in this layout, e.g.
        ``run train checkpoint``; None for a path the layout does not name."""
        try:
            parts = Path(path).resolve().relative_to(self.root.resolve()).parts
        except ValueError:
            return None
        return _describe(parts)


_MODEL_DIR = Name("v{version:04d}")


def _sidecar_of(name: str, kind: Name) -> bool:
    m = SIDECAR.match(name)
    return kind.match(name) is not None or (m is not None and kind.match(m["name"]) is not None)


def _train_file(rest: tuple[str, ...]) -> str | None:
    """What a file of a training folder is (``rest``: its path inside the folder)."""
    t = TrainFiles(Path())
    plain = {
        t.config.name: "config",
        t.result.name: "result",
        t.metrics.name: "metrics",
        t.init.name: "initial weights",
        t.delta.name: "round delta",
        t.delta_sidecar.name: "round delta sidecar",
    }
    if len(rest) == 1:
        if rest[0] in plain:
            return plain[rest[0]]
        return "failure record" if _FAILURE.match(rest[0]) else None
    if len(rest) == 3 and rest[0] == t.checkpoints.name and TENSORS.match(rest[1]):
        return "checkpoint shard tensors"  # a stage's DCP folder's files
    if len(rest) != 2:
        return None
    folder, name = rest
    if folder == t.checkpoints.name and _sidecar_of(name, CHECKPOINT):
        return "checkpoint"
    if folder == t.checkpoints.name and _sidecar_of(name, SHARD):
        return "checkpoint shard"
    if folder == t.traces.name and (LAST_TRACE.match(name) or EPOCH_TRACE.match(name)):
        return "step trace"
    if folder == t.ranks.name and RANK_RECORD.match(name):
        return "rank record"
    return None


def _describe(parts: tuple[str, ...]) -> str | None:
    lay = ArtifactLayout(Path())
    if len(parts) == 3 and parts[0] == lay.data_root.name:
        d = DataFiles(Path())
        name = parts[2]
        if parts[1] == lay.sources.name:
            return "source copy"
        if name in (d.stats.name, d.manifest.name) or _SPLIT.match(name):
            return "prepared data"
        return None
    if len(parts) >= 4 and parts[0] == lay.runs.name:
        run, rest = RunLayout(Path()), parts[3:]
        if rest == (run.evaluation.name,):
            return "run evaluation"
        if rest in ((MLFLOW_RECORD,), (MLFLOW_PENDING,)):
            return "run mlflow record"
        if rest[0] == run.train.dir.name:
            what = _train_file(rest[1:])
            return None if what is None else f"run train {what}"
        if rest[0] != run.rounds.name or len(rest) < 3:
            return None
        if rest[1] == run.globals.name and len(rest) == 3:
            return "round global checkpoint" if _sidecar_of(rest[2], CHECKPOINT) else None
        if _ROUND_DIR.match(rest[1]) is None:
            return None
        if len(rest) == 3 and rest[2] == run.round_result(0).name:
            return "round result"
        if _SHARD_DIR.match(rest[2]) is not None:
            what = _train_file(rest[3:])
            return None if what is None else f"round shard {what}"
        return None
    if parts and parts[0] == lay.registry.name:
        rest = parts[1:]
        if rest in ((lay.registry_file.name,), (lay.registry_lock.name,)):
            return "registry"
        if rest == (MLFLOW_RECORD,):
            return "registry mlflow record"
        model = lay.model(1)
        if (
            len(rest) == 3
            and rest[0] == model.parent.parent.name
            and _MODEL_DIR.match(rest[1])
            and rest[2] in (model.name, SIDECAR(name=model.name))
        ):
            return "registered model"
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def safe_name(s: str) -> str:
    """A run id as one path component, injectively: letters, digits, ``_``, ``-`` and
    ``.`` (not leading) stay, every other byte is ``~`` and two hex digits
    (``manual__2026-11-30T04:32:18+00:00`` is ``manual__2026-11-30T04~3a32~3a18~2b00~3a00``).
    Two run ids never share a folder: a run id chosen to look like another's folder
    (``scheduled__2026-01-05T00_00_00_00_00``) gets a folder of its own."""
    out = "".join(
        c if c in _KEPT and not (c == "." and i == 0) else "".join(f"~{b:02x}" for b in c.encode())
        for i, c in enumerate(s)
    )
    if len(out) > _LONGEST:  # a file name has 255 bytes: a prefix, and a digest of it all
        # ("~~" never occurs in a short name: "~" there is always followed by hex digits)
        head = out[: _LONGEST - 66]
        if (cut := head.rfind("~")) >= len(head) - 2:  # not an escape cut in two
            head = head[:cut]
        return f"{head}~~{hashlib.sha256(s.encode()).hexdigest()}"
    return out or "~"


_LONGEST = 200

_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
