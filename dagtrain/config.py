"""The pipeline config: one pydantic model, YAML in, JSON Schema (and Airflow Params) out.

A pipeline is described once, in a YAML file beside its DAG file::

    name: digits
    data: {source: digits, val_fraction: 0.1, test_fraction: 0.2}
    model: {name: mlp, args: {hidden: [64]}}
    training: {epochs: 3, batch_size: 64, lr: 0.05}
    distributed: {backend: mpi, ranks: 2}

``load_config(path)`` reads it (``yaml.safe_load``) and validates it; errors name the
field path (``training.epochs``) and what is allowed. ``dag_params(config)`` turns the
same model's JSON Schema into the DAG's Airflow ``Params``, one per section, so the web
UI's trigger form, the REST API and ``dagtrain run --set`` are all checked by the same
schema before any task runs. ``merge_conf(config, conf)`` applies a run's ``conf``.

Fields that name code or places (a model factory's import path, the artifact root, the
hosts ranks run on) are the DAG author's: a run's conf may only repeat the file's value
(the schema pins them), so nobody who can trigger a run can make a worker import a
module of their choosing. This module imports neither torch nor airflow.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "BUILTIN_MODELS",
    "FILE_ONLY",
    "ConfigError",
    "PipelineConfig",
    "apply_sets",
    "parse_sets",
    "config_schema",
    "deep_merge",
    "dag_params",
    "load_config",
    "merge_conf",
]

# the training layer's registry (kept here as names only: no torch at import)
BUILTIN_MODELS = ("mlp", "cnn", "rescnn", "transformer")
# fields only a config file may set: a run's conf may repeat the file's value, no other
# (model.name too, unless the conf names a built-in)
FILE_ONLY = (
    "name",
    "pipeline",
    "artifacts.root",
    "distributed.hosts",
    "rounds.rounds",
    "rounds.shards",
)


class ConfigError(ValueError):
    """A config (file, --set or conf) that does not validate; the message names fields."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Section):
    source: str = Field(
        "digits",
        description="'digits' (scikit-learn's, no download) or a .npz/.npy/.csv/.parquet "
        "path (relative to the config file)",
    )
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="held out for validation")
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="held out for evaluation")
    normalize: bool = Field(True, description="standardise with statistics of train only")
    seed: int = Field(0, description="seed of the split and of the shards")


class ModelConfig(_Section):
    name: str = Field(
        "mlp",
        description="a built-in (mlp, cnn, rescnn, transformer) or 'package.module:factory' "
        "(config files only, never a run's conf)",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v not in BUILTIN_MODELS and ":" not in v:
            raise ValueError(
                f"{v!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}) "
                "nor 'package.module:factory'"
            )
        return v


class TrainingConfig(_Section):
    epochs: int = Field(5, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps")
    batch_size: int = Field(64, ge=1, description="global batch, split over the ranks")
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = 0
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="non-finite gradients: fail, or skip the step on every rank"
    )
    checkpoint_every: int = Field(0, ge=0, description="steps; 0: at the end of each epoch")
    keep_checkpoints: int = Field(3, ge=1)
    retries: int = Field(
        2, ge=0, description="Airflow retries of each task (a retry resumes training)"
    )
    retry_delay_seconds: float = Field(10.0, ge=0)
    timeout_minutes: float | None = Field(
        None, gt=0, description="execution_timeout of a training task: its ranks are killed"
    )


class DistributedConfig(_Section):
    backend: Literal["mpi", "torch", "horovod", "local"] = Field(
        "mpi", description="gradient sync: mpi (mpi4py), torch (gloo/nccl), horovod, local"
    )
    ranks: int = Field(2, ge=1, le=256, description="processes (ranks) per training task")
    launcher: Literal["mpirun", "horovodrun", "torchrun", "direct"] | None = Field(
        None, description="default: mpirun for mpi/horovod, direct for torch/local"
    )
    hosts: list[str] = Field(
        default_factory=list,
        description="'host:slots' for several machines (config files only)",
    )
    bucket_mb: float = Field(25.0, gt=0, description="gradient bucket size")
    overlap: bool = Field(True, description="false: backward, then sync all, then step")
    collective_timeout: float = Field(60.0, gt=0, description="seconds for any collective")


class ExecutorConfig(_Section):
    workers: int = Field(2, ge=1, le=64, description="task-graph threads per rank")
    intra_op_threads: int = Field(1, ge=1, description="torch threads per rank")
    trace: bool = Field(True, description="write the last step's Perfetto trace")


class EvaluationConfig(_Section):
    metric: Literal["test_accuracy", "test_loss"] = "test_accuracy"
    min_improvement: float = Field(
        0.0, ge=0, description="a challenger must beat the champion by more than this"
    )
    min_accuracy: float = Field(0.0, ge=0, le=1, description="never promote below this")


class ScheduleConfig(_Section):
    cron: str | None = Field(None, description="cron or preset (@daily); none: manual only")
    asset: str | None = Field(
        None, description="retrain when this Asset (URI) is updated, instead of on cron"
    )


class RoundsConfig(_Section):
    rounds: int = Field(3, ge=1, le=100, description="rounds of local training + sync")
    shards: int = Field(2, ge=1, le=64, description="shards trained independently per round")
    local_steps: int = Field(20, ge=1, description="inner steps per shard per round")
    outer_lr: float = Field(0.7, gt=0, description="outer SGD learning rate (DiLoCo: 0.7)")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum")


class ArtifactsConfig(_Section):
    root: str = Field(
        "../.dagtrain/artifacts",
        description="where data, checkpoints, traces and the model registry go; relative "
        "to the config file (config files only)",
    )


class PipelineConfig(_Section):
    """A training pipeline: data prep, distributed training, evaluation, promotion."""

    name: str = Field("digits", pattern=r"^[A-Za-z0-9_.-]+$", description="pipeline name")
    pipeline: Literal["retraining", "rounds"] = Field(
        "retraining",
        description="the DAG a bare config gets from `dagtrain run`: prep -> train -> "
        "evaluate -> promote, or round-based training",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    rounds: RoundsConfig = Field(default_factory=RoundsConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    # where the file was read from: relative paths resolve against it (not a field of
    # the file, never part of the schema)
    _base_dir: str | None = PrivateAttr(None)

    @property
    def base_dir(self) -> str | None:
        return self._base_dir

    @base_dir.setter
    def base_dir(self, value: str | None) -> None:
        self._base_dir = value

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        d = self.distributed
        if d.backend == "local" and d.ranks != 1:
            raise ValueError(
                f"distributed.ranks is {d.ranks} but backend 'local' is one process: "
                "set distributed.ranks: 1 or choose mpi, torch or horovod"
            )
        if self.training.batch_size < d.ranks:
            raise ValueError(
                f"training.batch_size {self.training.batch_size} is smaller than "
                f"distributed.ranks {d.ranks}: each rank needs a sample per step"
            )
        return self

    def path(self, p: str) -> Path:
        """A path of the config, resolved against the config file's folder."""
        q = Path(p).expanduser()
        if not q.is_absolute() and self.base_dir:
            q = Path(self.base_dir) / q
        return q.resolve()

    @classmethod
    def from_yaml(cls, path: str | Path) -> PipelineConfig:
        """Read and validate a YAML config file (same as ``load_config``)."""
        return load_config(path)

    def params(self) -> dict[str, Any]:
        """The Airflow ``Params`` of a DAG built from this config (``dag_params``)."""
        return dag_params(self)

    def artifact_root(self) -> Path:
        return self.path(self.artifacts.root) / self.name

    def data_source(self) -> str:
        s = self.data.source
        return s if s == "digits" else str(self.path(s))


# -- errors ------------------------------------------------------------------------------


def _explain(e: ValidationError, where: str) -> ConfigError:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling and its section)"
        if not loc:  # a check across fields: its message names them
            lines.append(f"  {msg}")
        else:
            lines.append(f"  {loc}: {msg} (got {err.get('input')!r})")
    return ConfigError(f"{where}: invalid config\n" + "\n".join(lines))


def validate(data: dict[str, Any], where: str = "config", base_dir: str | None = None):
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise _explain(e, where) from None
    cfg.base_dir = base_dir
    return cfg


_loaded: dict[tuple[str, int, int], PipelineConfig] = {}


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config file (``yaml.safe_load`` only).

    A file is read again only when it changed (Airflow parses DAG files every few
    seconds, in a process that keeps this module loaded)."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    if key in _loaded:
        return _loaded[key].model_copy(deep=True)
    cfg = _load_config(p)
    if key is not None:
        _loaded[key] = cfg.model_copy(deep=True)
    return cfg


def _load_config(p: Path) -> PipelineConfig:
    import yaml

    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, not a list/value")
    cfg = validate(data, str(p), str(p.resolve().parent))
    return cfg


# -- overrides ---------------------------------------------------------------------------


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "args":
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _author_only(cfg: PipelineConfig) -> dict[str, Any]:
    """Dotted field -> the file's value, for fields a run's conf may not change."""
    values = cfg.model_dump(mode="json")
    return {f: _get(values, f) for f in FILE_ONLY}


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


_MISSING = object()


def merge_conf(cfg: PipelineConfig, conf: dict[str, Any] | None) -> PipelineConfig:
    """The config of one run: the file's, with a run's ``conf`` (sections) merged in.

    Refuses (ConfigError naming the field) a conf that changes a field only a config
    file may set, or a model factory path that is not the file's own.
    """
    conf = dict(conf or {})
    if not conf:
        return cfg
    known = set(PipelineConfig.model_fields)
    for k in conf:
        if k not in known:
            raise ConfigError(
                f"conf: unknown section {k!r}; sections are {', '.join(sorted(known))}"
            )
    for field, value in _author_only(cfg).items():
        got = _get(conf, field)
        if got is not _MISSING and got != value:
            raise ConfigError(
                f"conf: {field} may be set only in the config file in the DAGs folder, "
                f"not by a run's conf (the file says {value!r})"
            )
    name = _get(conf, "model.name")
    if name is not _MISSING and name != cfg.model.name and name not in BUILTIN_MODELS:
        raise ConfigError(
            f"conf: model.name {name!r} names code; a run's conf may choose only a built-in "
            f"({', '.join(BUILTIN_MODELS)}) or the file's own model; put a factory path in "
            "the config file"
        )
    merged = deep_merge(cfg.model_dump(mode="json"), conf)
    return validate(merged, "conf", cfg.base_dir)


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """``--set training.epochs=3`` items as a conf dict (values parsed as YAML scalars),
    not validated."""
    import yaml

    conf: dict[str, Any] = {}
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {item!r}: use key=value, e.g. training.epochs=3")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        parts = key.split(".")
        d = conf
        for part in parts[:-1]:
            d = d.setdefault(part, {})
            if not isinstance(d, dict):
                raise ConfigError(f"--set {item!r}: {part} is set twice")
        d[parts[-1]] = value
    return conf


def apply_sets(cfg: PipelineConfig, sets: list[str]) -> dict[str, Any]:
    """``--set`` items as a conf dict, validated against ``cfg`` (errors name the field)."""
    conf = parse_sets(sets)
    merge_conf(cfg, conf)
    return conf


# -- schema ------------------------------------------------------------------------------


def config_schema() -> dict[str, Any]:
    """JSON Schema of a pipeline config, with references inlined."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict[str, Any]:
    schema = PipelineConfig.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**target, **rest})
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    def untitled(node: Any) -> Any:  # pydantic's titles repeat the names; parsing pays
        if isinstance(node, dict):  # for every key in Airflow's schema checks
            return {k: untitled(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [untitled(v) for v in node]
        return node

    return untitled(inline(schema))


def _lean(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _lean(v) for k, v in node.items() if k not in ("default", "description")}
    if isinstance(node, list):
        return [_lean(v) for v in node]
    return node


def dag_params(cfg: PipelineConfig) -> dict[str, Any]:
    """Airflow ``Params`` for a DAG built from ``cfg``: one object per section, its
    default the file's values, its schema the config's, with author-only fields pinned.
    """
    from airflow.sdk import Param

    schema = config_schema()
    values = cfg.model_dump(mode="json")
    params: dict[str, Any] = {}
    for section, sub in schema["properties"].items():
        if section in ("name", "pipeline"):
            continue
        sub.pop("default", None)  # config_schema() returned a copy of its own
        props = sub.get("properties", {})
        if section == "model":
            names = sorted({*BUILTIN_MODELS, cfg.model.name})
            props["name"] = {**props["name"], "enum": names}
        if section == "artifacts":
            props["root"] = {**props["root"], "const": cfg.artifacts.root}
        if section == "distributed":
            props["hosts"] = {**props["hosts"], "const": list(cfg.distributed.hosts)}
        if section == "rounds":  # the DAG's shape: fixed when the file is parsed
            props["rounds"] = {**props["rounds"], "const": cfg.rounds.rounds}
            props["shards"] = {**props["shards"], "const": cfg.rounds.shards}
        sub["additionalProperties"] = False
        sub.pop("required", None)  # a conf may give part of a section; the rest is the file's
        description = sub.pop("description", None)
        # only what validates: Airflow deep-copies every Param into every task at parse
        # time, so defaults (the Param's value holds them) and field descriptions (the
        # config reference has them) would be paid for on every parse
        # draft 7 has all we use, and jsonschema checks a schema against draft 7's
        # metaschema several times faster than against 2020-12's (Airflow checks every
        # Param of a scheduled DAG at each parse)
        schema = {"$schema": "http://json-schema.org/draft-07/schema#", **_lean(sub)}
        params[section] = Param(values[section], schema=schema, description=description)
    return params
