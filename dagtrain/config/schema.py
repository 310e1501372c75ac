"""The config's models: the sections of a training run, declared once, and what a rank
receives.

``TrainConfig`` is what every rank of one training run receives: the pipeline's
``model``, ``training``, ``distributed``, ``parallel`` and ``executor`` sections as they
are, plus the run's files. The pipeline as a whole (a YAML file: these sections and the
DAG's own) is :class:`~.pipeline.PipelineConfig`. Pydantic only: no torch, no airflow.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, field_validator, model_validator

from dagtrain.errors import InputError

from .section import SEED_MAX, Section
from .training import TrainingConfig

# The names of things code implements elsewhere, listed here once (no torch at import):
# the training layer's model registry, the gradient-sync backends, the launchers.
BuiltinModel = Literal["mlp", "cnn", "rescnn", "transformer"]
BackendName = Literal["mpi", "torch", "horovod", "local"]
Launcher = Literal["mpirun", "horovodrun", "torchrun", "direct"]
BUILTIN_MODELS: tuple[str, ...] = get_args(BuiltinModel)  # model.name without a factory path
# what a model is trained to do (dagtrain.training.rank.objective implements them)
BuiltinObjective = Literal["classification", "regression", "language_model"]
BUILTIN_OBJECTIVES: tuple[str, ...] = get_args(BuiltinObjective)
# the metrics each built-in objective reports and which way is better, the metric that
# decides promotion unless evaluation.metric says otherwise first
OBJECTIVE_METRICS: dict[str, dict[str, str]] = {
    "classification": {"accuracy": "max", "loss": "min"},
    "regression": {"mse": "min", "mae": "min", "r2": "max", "loss": "min"},
    "language_model": {"perplexity": "min", "accuracy": "max", "loss": "min"},
}
# data.source names that need no file: the datasets scikit-learn ships (no download)
BUILTIN_SOURCES = ("digits", "diabetes")
# what each built-in objective's targets are: class indices, real values, token ids
OBJECTIVE_TARGETS: dict[str, str] = {
    "classification": "classes",
    "regression": "values",
    "language_model": "tokens",
}
# the backends whose point-to-point transfers a pipeline's stages use
PIPELINE_BACKENDS = ("torch", "mpi")
# NCCL matches a pair's sends and receives by the order they are posted, not by tag; with
# chunks the two ranks post one direction's transfers of different chunks in different
# orders (each rank's ready tasks decide), so a chunked pipeline needs tags: gloo or MPI
CHUNKS_ON_NCCL = (
    "parallel.chunks {chunks} with distributed.backend torch on GPUs: NCCL pairs a send "
    "with a receive by the order they are posted, not by their tags, and a chunked "
    "pipeline's ranks post different chunks' transfers in different orders; use "
    "distributed.backend mpi (CUDA-aware MPI or host copies) or parallel.chunks 1"
)
# the launcher a backend gets when distributed.launcher is not set
DEFAULT_LAUNCHER: dict[str, str] = {
    "mpi": "mpirun",
    "horovod": "mpirun",
    "torch": "direct",
    "local": "direct",
}
# the sections every rank of a training run receives as they are
RUN_SECTIONS = ("model", "objective", "training", "distributed", "parallel", "executor")
# the orders a pipeline-parallel step can run in (dagtrain.training.rank.pipelining): the same
# graph under other priorities and another bound on live microbatches
Order = Literal["auto", "gpipe", "1f1b", "zero-bubble"]
# fields only a config file may set, and why: a run's conf may repeat the file's value,
# no other (model.name too, unless the conf names a built-in). The DAG's Params pin them,
# so the trigger form and the REST API refuse a conf that changes one.
_PARSED = "Airflow reads it when it parses the DAG file, so a run's conf could not change it"
FILE_ONLY: dict[str, str] = {
    "name": "it names the DAG",
    "pipeline": "it shapes the DAG",
    "artifacts.root": "it is a place on the workers",
    "data.source": "it is a file on the workers, a URL, or code they import",
    "data.connection": "it holds credentials to the data's storage (an Airflow connection)",
    "data.test_fraction": "it decides the test split that promotion is judged on",
    "data.sequence_length": "it decides the test windows that promotion is judged on",
    "data.vocab_size": "it decides the test windows that promotion is judged on",
    "objective": "it decides what the model learns and which metric makes the champion",
    "model.max_parameters": "it bounds the memory a run's model.args may ask of the workers",
    "evaluation": "it decides which model becomes the champion",
    "tracking": "it names a tracking server (an Airflow connection)",
    "distributed.hosts": "it names machines to run on",
    "distributed.hosts_connection": "it names the machines to run on (an Airflow connection)",
    "rounds.rounds": "it shapes the DAG",
    "rounds.shards": "it shapes the DAG",
    "training.retries": _PARSED,
    "training.retry_delay_seconds": _PARSED,
    "training.timeout_minutes": _PARSED,
    "schedule.cron": _PARSED,
    "schedule.asset": _PARSED,
}

# sections a kind of pipeline does not use: the trigger form does not offer them, and a
# run's conf may not change them
NOT_APPLICABLE: dict[str, tuple[str, ...]] = {"retraining": ("rounds",), "rounds": ()}


# model.max_parameters's default: 400 MB of fp32 weights, 1.6 GB with their gradient and
# Adam's two moments, on each rank; the largest built-in example has 21M
MAX_PARAMETERS = 100_000_000


class ConfigError(InputError):
    """A config (file, --set or conf) that does not validate; the message names fields."""


class DataConfig(Section):
    """Where the data comes from and how it is split: train, validation, test."""

    source: str = Field(
        "digits",
        description="'digits' or 'diabetes' (scikit-learn's: 8x8 images of 10 classes, or "
        "10 features and a real target; no download); a .npz/.npy/.csv/.parquet "
        "path (relative to the config file) or object-storage URL (s3://, gs://, file://, "
        "... read with data.connection); a text file (.txt, its UTF-8 bytes the tokens) or "
        "token ids (.bin of uint16, or a 1-D integer .npy) with data.sequence_length; or "
        "'package.module:factory' returning a torch.utils.data.Dataset of (input, "
        "target) pairs, or a pair of arrays (config files only)",
    )
    connection: str | None = Field(
        None,
        description="the Airflow connection an object-storage data.source is read with "
        "(its credentials); not set: the filesystem's default (config files only)",
    )
    workers: int = Field(
        0,
        ge=0,
        le=64,
        description="DataLoader worker processes of each rank reading a Dataset factory's "
        "samples; 0: read in the rank's own process",
    )
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="held out for validation")
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="held out for evaluation")
    normalize: bool = Field(
        True,
        description="standardise floating inputs with statistics of train only (token "
        "ids and other integer inputs stay as they are)",
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the split and of the shards")
    sequence_length: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="a text or token source is cut into windows of this many tokens, each "
        "window's target the same window shifted by one token; the split is by windows. "
        "Required for such a source, ignored for others",
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        le=2**31 - 1,
        description="a token source's vocabulary: ids at or above it are refused; not set: "
        "the largest id + 1 (a text's: 256, its bytes)",
    )

    @model_validator(mode="after")
    def _connection_for_a_url(self) -> DataConfig:
        if self.connection is not None and "://" not in self.source:
            raise ValueError(
                f"data.connection {self.connection!r} can have no effect: data.source "
                f"{self.source!r} is not an object-storage URL (s3://, gs://, ...), which "
                "is what the connection is read with; remove data.connection"
            )
        return self

    @model_validator(mode="after")
    def _leaves_data_to_train_on(self) -> DataConfig:
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"data.val_fraction ({self.val_fraction}) + data.test_fraction "
                f"({self.test_fraction}) leave under 10% for training; lower them"
            )
        return self


class ModelConfig(Section):
    """The model: a built-in by name, or a factory of the DAG author's, and its arguments."""

    name: str = Field(
        "mlp",
        description="a built-in (mlp, cnn, rescnn, transformer) or 'package.module:factory' "
        "(config files only, never a run's conf)",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    max_parameters: int = Field(
        MAX_PARAMETERS,
        ge=1,
        description="the most parameters the model may have: model.args that build a "
        "larger one are refused before it is built",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v not in BUILTIN_MODELS and ":" not in v:
            raise ValueError(
                f"{v!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}) nor "
                "'package.module:factory'"
            )
        return v


class ObjectiveConfig(Section):
    """What the model is trained to do: the loss of its output on a batch's target, the
    metrics reported (each with the direction that is better), summed exactly over
    microbatches, ranks and evaluation batches."""

    name: str = Field(
        "classification",
        description="classification (cross-entropy; loss, accuracy), regression (mean "
        "squared error; loss, mse, mae, r2), language_model (next-token cross-entropy; "
        "loss, perplexity, accuracy of the tokens), or 'package.module:factory' returning "
        "an objective of the DAG author's (the whole section: config files only)",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of a factory's objective"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v not in BUILTIN_OBJECTIVES and not is_factory(v):
            raise ValueError(
                f"{v!r} is neither a built-in ({', '.join(BUILTIN_OBJECTIVES)}) nor "
                "'package.module:factory'"
            )
        return v

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN_OBJECTIVES

    @property
    def targets(self) -> str:
        """What the data's targets must be: classes, values, tokens, or any (the DAG
        author's own objective)."""
        return OBJECTIVE_TARGETS.get(self.name, "any")

    def metrics(self) -> dict[str, str] | None:
        """A built-in's metrics and their directions (None for the author's own: known
        once its code is imported, on the workers)."""
        return OBJECTIVE_METRICS.get(self.name)


class DistributedConfig(Section):
    """How many ranks, how they sync gradients, and how they are launched."""

    backend: BackendName = Field(
        "mpi", description="gradient sync: mpi (mpi4py), torch (gloo/nccl), horovod, local"
    )
    ranks: int = Field(2, ge=1, le=256, description="processes (ranks) per training task; local: 1")
    launcher: Launcher | None = Field(
        None, description="default: mpirun for mpi/horovod, direct for torch/local"
    )
    hosts: list[str] = Field(
        default_factory=list,
        description="'host:slots' for several machines (config files only)",
    )
    hosts_connection: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="an Airflow connection whose extra lists the hosts: "
        '{"hosts": ["10.0.0.2:1", ...], "rsh_agent": [...], "env": {...}} (config files only)',
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu",
        description="cpu; cuda: one GPU per rank, its local rank's (NCCL for torch), "
        "untested on a GPU yet; auto: cuda where the host has one",
    )
    bucket_mb: float = Field(
        25.0, gt=0, le=1e5, description="gradient bucket size; the first at most 1 MB"
    )
    overlap: bool = Field(
        True,
        description="true: allreduce overlaps backward while rank 0 measures it faster "
        "(checked all along); false: backward, then sync all, then step",
    )
    collective_timeout: float = Field(
        60.0, gt=0, le=7 * 86400, description="seconds for any collective"
    )
    min_ranks: int | None = Field(
        None,
        ge=1,
        le=256,
        description="elastic: when ranks or hosts are lost, the try goes on with the ranks "
        "left if at least this many (default: ranks, i.e. not elastic)",
    )
    max_world_changes: int = Field(
        4,
        ge=0,
        le=1000,
        description="elastic: world changes (relaunches, shrinks and grows) one try may "
        "make; a loss past them fails the try",
    )
    regrow: bool = Field(
        True,
        description="elastic: a lost host (or slot) that answers again is taken back at "
        "the next epoch boundary, up to ranks",
    )

    @model_validator(mode="after")
    def _one_host_list(self) -> DistributedConfig:
        if self.hosts and self.hosts_connection:
            raise ValueError(
                "distributed.hosts and distributed.hosts_connection are both set: give the "
                "hosts in one place (the connection, to keep them out of the DAG's files)"
            )
        return self

    @model_validator(mode="after")
    def _local_is_one_process(self) -> DistributedConfig:
        if self.backend == "local":
            if "ranks" not in self.model_fields_set:
                self.ranks = 1
            elif self.ranks != 1:
                raise ValueError(
                    f"distributed.ranks is {self.ranks} but backend 'local' is one process: "
                    "set distributed.ranks: 1 or choose mpi, torch or horovod"
                )
        return self

    @model_validator(mode="after")
    def _elastic_fits(self) -> DistributedConfig:
        if self.min_ranks is None:
            return self
        if self.min_ranks > self.ranks:
            raise ValueError(
                f"distributed.min_ranks {self.min_ranks} is more than distributed.ranks "
                f"{self.ranks}: a world can only shrink; set min_ranks to at most {self.ranks}"
            )
        if self.backend == "local" and self.min_ranks < self.ranks:
            raise ValueError(
                "distributed.min_ranks: backend 'local' is one process, it cannot shrink; "
                "choose mpi, torch or horovod for an elastic run"
            )
        return self

    @property
    def elastic(self) -> bool:
        """Whether a lost rank or host shrinks the world instead of failing the try."""
        return self.min_ranks is not None and self.min_ranks < self.ranks

    @property
    def fewest_ranks(self) -> int:
        """``min_ranks``, or ``ranks`` where it is not set."""
        return self.ranks if self.min_ranks is None else self.min_ranks

    @property
    def resolved_launcher(self) -> str:
        """``launcher``, or the backend's default one."""
        return self.launcher or DEFAULT_LAUNCHER[self.backend]


class ParallelConfig(Section):
    """Pipeline parallelism: the model's blocks split into stages, each step's batch cut
    into microbatches. ``distributed.ranks`` is stages x replicas (each stage's
    replicas average their gradients, data-parallel). One stage: data parallelism only.
    """

    stages: int = Field(
        1,
        ge=1,
        le=64,
        description="pipeline stages S the model's blocks are split into; "
        "distributed.ranks = S x replicas; 1: no pipeline",
    )
    microbatches: int = Field(
        1,
        ge=1,
        le=4096,
        description="microbatches M each replica's share of a step's batch is cut into "
        "(training.batch_size must divide by M x replicas)",
    )
    chunks: int = Field(
        1,
        ge=1,
        le=16,
        description="model chunks v per rank: the blocks are cut into S x v parts and rank "
        "s holds parts s, s + S, ... (parallel.placement looped; with order 1f1b: "
        "interleaved 1F1B, gpipe: looped BFS, zero-bubble: interleaved zero-bubble), or "
        "two in a V; a smaller bubble for more transfers. 1: one contiguous stage per rank",
    )
    placement: Literal["looped", "v"] = Field(
        "looped",
        description="where a rank's chunks are: looped (rank s holds parts s, s + S, ...) "
        "or v (parallel.chunks 2: rank s holds parts s and 2S - 1 - s, as torch's "
        "ScheduleZBVZeroBubble and ScheduleDualPipeV: the last rank hands its first chunk's "
        "output to its second in memory, and rank 0 holds the first part and the last, "
        "with the loss)",
    )
    order: Order = Field(
        "auto",
        description="gpipe (every forward first: M microbatches alive), 1f1b (a backward "
        "as soon as it can: about S - s alive on stage s), zero-bubble (as 1f1b, "
        "with the backwards after a stage's last forward split into input and weight "
        "gradients, the weights' late: they fill the cooldown's bubble at 1f1b's "
        "memory); auto: the faster of "
        "gpipe and 1f1b, measured on the first steps (gpipe holds every microbatch's "
        "activations during its 3 trial steps: choose 1f1b where memory is tight)",
    )
    split: Literal["auto"] | list[int] = Field(
        "auto",
        description="auto: by each block's measured forward+backward time; or S x v - 1 "
        "block indices, the first block of each part after the first (e.g. [3] for 2 "
        "stages: blocks 0-2, then 3 on)",
    )

    @field_validator("split", mode="before")
    @classmethod
    def _split_is_a_list(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):  # (split: 3 for [3])
            k = v if v >= 1 else 3
            raise ValueError(
                f"give the boundaries as a list, e.g. [{k}] (stage 0 = blocks 0-{k - 1}, the "
                f"next stage from block {k}), or auto"
            )
        return v

    @model_validator(mode="after")
    def _split_fits(self) -> ParallelConfig:
        if self.stages == 1 and self.microbatches > 1:
            raise ValueError(
                f"parallel.microbatches is {self.microbatches} with parallel.stages 1: "
                "microbatches are a pipeline's; set parallel.stages to 2 or more, or "
                "parallel.microbatches to 1"
            )
        if self.chunks > 1 and self.stages == 1:
            raise ValueError(
                f"parallel.chunks is {self.chunks} with parallel.stages 1: chunks are a "
                "pipeline's; set parallel.stages to 2 or more, or parallel.chunks to 1"
            )
        if self.placement == "v" and self.chunks != 2:
            raise ValueError(
                f"parallel.placement v with parallel.chunks {self.chunks}: a V places two "
                "chunks a rank (parts s and 2S - 1 - s); set parallel.chunks to 2, or "
                "placement to looped"
            )
        # (a V's 1f1b and zero-bubble follow ZBV's sequence, which takes any M)
        interleaved = self.order in ("1f1b", "zero-bubble", "auto") and self.placement == "looped"
        if self.chunks > 1 and interleaved and self.microbatches % self.stages:
            raise ValueError(
                f"parallel.microbatches {self.microbatches} with parallel.chunks "
                f"{self.chunks}: an interleaved {self.order} order sends microbatches "
                f"round in groups of parallel.stages {self.stages}; make microbatches a "
                f"multiple of {self.stages} (e.g. "
                f"{_multiple_of(self.microbatches, self.stages)}), or use order gpipe "
                "(looped BFS)"
            )
        if isinstance(self.split, list):
            cuts, parts = self.split, self.stages * self.chunks
            if len(cuts) != parts - 1:
                per = f" x {self.chunks} chunks" if self.chunks > 1 else ""
                raise ValueError(
                    f"parallel.split {cuts} has {len(cuts)} "
                    f"{'boundary' if len(cuts) == 1 else 'boundaries'}; {self.stages} stages"
                    f"{per} need {parts - 1} (the first block of each part after the "
                    "first), or split: auto"
                )
            if any(c < 1 for c in cuts) or any(b <= a for a, b in zip(cuts, cuts[1:])):
                raise ValueError(
                    f"parallel.split {cuts}: boundaries must be increasing block indices "
                    "of at least 1 (stage 0 keeps the blocks before the first)"
                )
        return self

    @property
    def parts(self) -> int:
        """S x v: the parts the model's blocks are cut into (rank stage s holds parts
        s, s + S, ...; in a V, s and 2S - 1 - s)."""
        return self.stages * self.chunks


def _multiple_of(n: int, k: int) -> int:
    """The smallest multiple of ``k`` that is at least ``n``."""
    return -(-n // k) * k


class ExecutorConfig(Section):
    """Each rank's op-level executor: its threads, torch's threads, the step trace."""

    workers: int = Field(2, ge=1, le=64, description="task-graph threads per rank")
    intra_op_threads: int = Field(1, ge=1, le=1024, description="torch threads per rank")
    keep_freed_memory: bool = Field(
        True,
        description="glibc's malloc keeps what a step frees for the next step (no page "
        "faults each step; a rank holds its peak); false: glibc's defaults. A process "
        "whose malloc was already chosen (by glibc's malloc variables or tunables, or a "
        "preloaded allocator: docs/training.md names them) keeps its own",
    )
    trace: bool = Field(
        True,
        description="write Perfetto traces of each epoch's last step (the newest 10) "
        "and of the run's last step",
    )


class RunSections(Section):
    """The sections a pipeline shares with every rank of its training runs."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)

    @model_validator(mode="after")
    def _batch_covers_the_ranks(self) -> RunSections:
        p, d, bs = self.parallel, self.distributed, self.training.batch_size
        if p.stages == 1 and bs < d.ranks:
            raise ValueError(
                f"training.batch_size {bs} is smaller than "
                f"distributed.ranks {d.ranks}: each rank needs a sample per step"
            )
        if d.elastic and p.stages == 1:
            bad = [m for m in range(d.fewest_ranks, d.ranks + 1) if bs % m]
            if bad:
                raise ValueError(
                    f"training.batch_size {bs} does not split evenly over "
                    f"{', '.join(map(str, bad))} rank(s), world sizes that "
                    f"distributed.min_ranks {d.min_ranks}..ranks {d.ranks} allow: make it a "
                    f"multiple of each of them (e.g. {_multiple(bs, d.fewest_ranks, d.ranks)})"
                )
        if p.stages == 1:
            return self
        if d.backend not in PIPELINE_BACKENDS:
            raise ValueError(
                f"parallel.stages is {p.stages} but distributed.backend {d.backend!r} has no "
                "point-to-point transfers dagtrain uses: choose distributed.backend torch "
                "or mpi for a pipeline"
            )
        if p.chunks > 1 and d.backend == "torch" and d.device == "cuda":
            raise ValueError(CHUNKS_ON_NCCL.format(chunks=p.chunks))
        if d.ranks % p.stages:
            raise ValueError(
                f"distributed.ranks {d.ranks} is not a multiple of parallel.stages "
                f"{p.stages}: the ranks are stages x replicas (e.g. ranks: "
                f"{p.stages * max(1, d.ranks // p.stages)})"
            )
        replicas = d.ranks // p.stages
        if bs % (replicas * p.microbatches):
            raise ValueError(
                f"training.batch_size {bs} does not divide into parallel.microbatches "
                f"{p.microbatches} on each of {replicas} replica(s) (distributed.ranks "
                f"{d.ranks} / parallel.stages {p.stages}): make it a multiple of "
                f"{replicas * p.microbatches}"
            )
        if d.elastic:
            # an elastic pipeline's worlds are whole replicas: S x D' ranks
            if d.fewest_ranks % p.stages:
                raise ValueError(
                    f"distributed.min_ranks {d.min_ranks} with parallel.stages {p.stages}: "
                    "an elastic pipeline's world is stages x replicas ranks; set min_ranks "
                    f"to a multiple of {p.stages} (e.g. {p.stages})"
                )
            worlds = range(d.fewest_ranks // p.stages, d.ranks // p.stages + 1)
            bad = [m for m in worlds if bs % (m * p.microbatches)]
            if bad:
                raise ValueError(
                    f"training.batch_size {bs} does not divide into parallel.microbatches "
                    f"{p.microbatches} on each of {', '.join(map(str, bad))} replica(s), "
                    f"worlds that distributed.min_ranks {d.min_ranks}..ranks {d.ranks} allow: "
                    "make it a multiple of replicas x microbatches for each of them (e.g. "
                    f"{_lcm_multiple(bs, [m * p.microbatches for m in worlds])})"
                )
        return self

    @model_validator(mode="after")
    def _recipe_fits(self) -> RunSections:
        t, p, d = self.training, self.parallel, self.distributed
        k, bs = t.accumulation_steps, t.batch_size
        if k > 1 and p.stages > 1:
            raise ValueError(
                f"training.accumulation_steps {k} with parallel.stages {p.stages}: a pipeline "
                "already accumulates its microbatches' gradients before one update; raise "
                f"parallel.microbatches instead (e.g. {p.microbatches * k}) and leave "
                "accumulation_steps 1"
            )
        if k > 1:
            worlds = range(d.fewest_ranks, d.ranks + 1) if d.elastic else (d.ranks,)
            bad = [m for m in worlds if bs % (m * k)]
            if bad:
                raise ValueError(
                    f"training.accumulation_steps {k} does not divide each rank's share of "
                    f"training.batch_size {bs} on {', '.join(map(str, bad))} rank(s): make "
                    f"batch_size a multiple of {k} x ranks (e.g. "
                    f"{_lcm_multiple(bs, [m * k for m in worlds])})"
                )
        if t.precision == "fp16":
            if d.device == "cpu":
                raise ValueError(
                    "training.precision fp16 needs a GPU (its gradient scaler is CUDA's) and "
                    "distributed.device is cpu: use precision bf16 on CPU, or device cuda"
                )
            if p.stages > 1:
                raise ValueError(
                    f"training.precision fp16 with parallel.stages {p.stages}: a pipeline "
                    "trains in fp32 or bf16 (no gradient scaler across stages); use bf16"
                )
        es, reported = t.early_stopping, self.objective.metrics()
        watched = es.metric if es is not None else None
        if watched is not None and reported is not None and watched not in reported:
            raise ValueError(
                f"training.early_stopping.metric {watched!r}: objective "
                f"{self.objective.name!r} does not report it; it reports {', '.join(reported)}"
            )
        return self

    @property
    def replicas(self) -> int:
        """D: the data-parallel copies of each pipeline stage (ranks / stages)."""
        return self.distributed.ranks // self.parallel.stages


class TrainConfig(RunSections):
    """What every rank of one training run receives: the pipeline's ``model``,
    ``training``, ``distributed`` and ``executor`` sections as they are, and the run's
    files. It is written into every checkpoint and the run's result.

    ``training.batch_size`` is the *global* batch: each step, the ranks split it evenly,
    so a run on N ranks sees the same samples per step as one process does. Without
    ``distributed.backend`` a run is one process (backend ``local``).

    Keyword shorthand: a field of the training, distributed or executor section may be
    given by its name alone, and ``model``/``model_args`` as a name and its arguments::

        TrainConfig(model="mlp", epochs=3, backend="mpi")
        # == TrainConfig(model={"name": "mlp"}, training={"epochs": 3},
        #                distributed={"backend": "mpi"})
    """

    distributed: DistributedConfig = Field(
        default_factory=lambda: DistributedConfig(backend="local")
    )
    data: str = Field(
        "digits",
        description="'digits' (scikit-learn's, no download), a path to .npz/.npy/.csv/.parquet "
        "(or a data-prep phase's split), or 'package.module:factory' (a Dataset or arrays)",
    )
    eval_data: str | None = Field(
        None,
        description="a separate file to evaluate on each epoch; then 'data' is all training "
        "data, both already prepared (a data-prep phase's files), and neither split nor "
        "normalised here",
    )
    test_fraction: float = Field(
        0.2, ge=0.0, lt=1.0, description="without eval_data: held out of 'data' for testing"
    )
    normalize: bool = Field(
        True,
        description="without eval_data: standardise floating inputs with statistics of train only",
    )
    sequence_length: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="data.sequence_length: a text or token source cut into windows of it",
    )
    vocab_size: int | None = Field(
        None, ge=2, le=2**31 - 1, description="data.vocab_size: of a token source"
    )
    data_workers: int = Field(
        0, ge=0, le=64, description="data.workers: DataLoader workers reading a Dataset's items"
    )
    init_from: str | None = Field(
        None,
        description="a checkpoint whose 'model' state starts the run (ignored when the run "
        "resumes from its own checkpoint_dir): round-based training's global model",
    )
    checkpoint_dir: str | None = None
    world: int | None = Field(
        None,
        ge=1,
        le=256,
        description="the ranks this launch runs on: distributed.ranks, or fewer after an "
        "elastic run lost some (set by the launching side)",
    )
    trace_dir: str | None = Field(
        None,
        description="write step traces here (if executor.trace): the last step's as "
        "step-rank<N>.json, each epoch's last step's as step<S>-rank<N>.json",
    )
    status_dir: str | None = Field(
        None,
        description="every rank keeps its record rank<N>.json here, rewritten every few "
        "seconds: host, pid, step, samples/s, median and p95 step time, and, when it fails, "
        "its error's type, message and traceback",
    )
    metrics_file: str | None = Field(
        None,
        description="rank 0 appends a JSON line here as the run starts, at each epoch's "
        "end (metrics, step, samples/s) and at its end: progress to tail",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("objective"), str):
            data["objective"] = {"name": data["objective"]}
        if isinstance(data.get("model"), str) or "model_args" in data:
            model = data.get("model", {})
            model = {"name": model} if isinstance(model, str) else _as_dict(model)
            if "model_args" in data:
                model["args"] = data.pop("model_args")
            data["model"] = model
        for key in [k for k in data if k in _SHORTHAND]:
            section = _SHORTHAND[key]
            data[section] = {**_as_dict(data.get(section, {})), key: data.pop(key)}
        dist = data.get("distributed")
        if isinstance(dist, dict) and "backend" not in dist:  # one process unless told
            data["distributed"] = {**dist, "backend": "local"}
        return data


# the kinds of file data.source may be: arrays, text and token ids
DATA_SUFFIXES = (".npz", ".npy", ".csv", ".parquet", ".txt", ".bin")


def is_factory(spec: str) -> bool:
    """``package.module:function``: a factory's import path, not a file or a URL."""
    mod, sep, attr = spec.partition(":")
    if spec.lower().endswith(DATA_SUFFIXES):  # a file, its name with :
        return False
    return bool(sep) and all(p.isidentifier() for p in (*mod.split("."), *attr.split(".")))


def _multiple(at_least: int, low: int, high: int) -> int:
    """The least multiple of every number in low..high that is at least ``at_least``."""
    import math

    lcm = math.lcm(*range(low, high + 1))
    return lcm * max(1, -(-at_least // lcm))


def _lcm_multiple(at_least: int, numbers: list[int]) -> int:
    """The least common multiple of ``numbers`` that is at least ``at_least``."""
    import math

    lcm = math.lcm(*numbers)
    return lcm * max(1, -(-at_least // lcm))


def _as_dict(v: Any) -> dict[str, Any]:
    return v.model_dump(exclude_unset=True) if isinstance(v, BaseModel) else dict(v)


_SHORTHAND = {
    f: s
    for s in ("training", "distributed", "executor")
    for f in RunSections.model_fields[s].annotation.model_fields
}
assert not set(_SHORTHAND) & set(TrainConfig.model_fields), "shorthand names collide"
