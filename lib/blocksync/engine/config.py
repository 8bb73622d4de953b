"""Typed training settings.

`TrainConfig` is what the driver resolves before launch; it is plain data (it
pickles to the executors as is). Every field is validated in `__post_init__`
with a `ValueError` that names the bad value and the fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

Backend = Literal["horovod", "torch_gloo", "spark", "auto"]
SyncMode = Literal["gradients", "parameters"]
OptimizerName = Literal["sgd", "adam", "adamw"]
ScheduleName = Literal["constant", "cosine", "step"]
DeviceName = Literal["cpu", "cuda", "auto"]
TaskKind = Literal["classification", "regression"]
Compression = Literal["none", "fp16", "topk", "int8", "powersgd"]
BlockSource = Literal["auto", "shuffle", "files"]
BlockStorage = Literal["auto", "memory", "disk", "stream"]
EpochOrderName = Literal["global", "chunks", "auto"]
ReduceOp = Literal["sum", "adasum"]
FaultMode = Literal["exit", "raise", "hang", "executor"]
MixedPrecision = Literal["none", "bf16"]
Shard = Literal["none", "optimizer"]
BalanceMode = Literal["even", "speed"]

BACKENDS: tuple[str, ...] = get_args(Backend)
BLOCK_SOURCES: tuple[str, ...] = get_args(BlockSource)
BLOCK_STORAGES: tuple[str, ...] = get_args(BlockStorage)
SYNC_MODES: tuple[str, ...] = get_args(SyncMode)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
DEVICES: tuple[str, ...] = get_args(DeviceName)
TASKS: tuple[str, ...] = get_args(TaskKind)
COMPRESSIONS: tuple[str, ...] = get_args(Compression)
SHARDS: tuple[str, ...] = get_args(Shard)


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}; pick one of those.")


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} must be {bound}.")


REGISTRY = ("logreg", "mlp", "cnn", "embedding_mlp", "transformer")
"""The built-in networks (`models`); any other `ModelSpec.name` is an import path."""


@dataclass(kw_only=True)
class ModelSpec:
    """Which network to build; resolved identically on the driver and every worker."""

    name: str = "mlp"
    """Registry name or an import path `package.module:factory` (see `models`). One float matrix:
    `logreg`, `mlp`, `cnn`, or a factory taking (num_features, num_outputs, **options). Typed inputs:
    `embedding_mlp`, `transformer`, or a factory taking (input_spec, num_outputs, **options). A factory
    returns an nn.Module."""
    hidden: list[int] = field(default_factory=lambda: [128, 64])
    """Hidden layer widths of `mlp` and `embedding_mlp`."""
    dropout: float = 0.0
    """Dropout after each hidden layer of `mlp` and `embedding_mlp`, and in `transformer`'s layers (0 keeps
    replicas trivially deterministic)."""
    image_shape: list[int] | None = None
    """(channels, height, width) for `cnn`; features are reshaped to it. None: square, 1 channel."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to an import-path factory."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model.name is empty; use logreg, mlp, cnn or 'package.module:factory'.")
        if any(int(h) <= 0 for h in self.hidden):
            raise ValueError(f"model.hidden={self.hidden} must hold positive layer widths.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout} must be in [0, 1).")


@dataclass(kw_only=True)
class HorovodSettings:
    """Horovod's tuning knobs (used by backend=horovod)."""

    fusion_threshold_mb: float = 128.0
    """HOROVOD_FUSION_THRESHOLD in MiB (Horovod's default: 128). blocksync already sends one fused
    buffer per step, so this matters only for buffers larger than it. A non-default value needs
    spark.python.worker.reuse=false (Horovod 0.28.1 segfaults re-initializing after one)."""
    cycle_time_ms: float = 1.0
    """HOROVOD_CYCLE_TIME: how often the background thread batches ready tensors (default 1 ms)."""
    reduce_op: ReduceOp = "sum"
    """`sum` (then divided by the global batch: exact averaging) or `adasum` (needs an MPI or NCCL build)."""

    def __post_init__(self) -> None:
        _positive("horovod.fusion_threshold_mb", self.fusion_threshold_mb)
        _positive("horovod.cycle_time_ms", self.cycle_time_ms, allow_zero=True)
        _choice("horovod.reduce_op", self.reduce_op, get_args(ReduceOp))


@dataclass(kw_only=True)
class CheckpointSettings:
    """Periodic checkpoints (rank 0's model and optimizer, every rank's own state)."""

    dir: str | None = None
    """Folder or URI (file://, hdfs://, s3://, a /dbfs path ...) through pyarrow; null: no checkpoints."""
    every_steps: int = 100
    """Steps between checkpoints."""
    keep: int = 2
    """How many of the newest checkpoints to keep."""

    def __post_init__(self) -> None:
        _positive("checkpoint.every_steps", self.every_steps)
        _positive("checkpoint.keep", self.keep)


@dataclass(kw_only=True)
class TimeoutSettings:
    """How long to wait before calling a worker stalled."""

    step_seconds: float = 300.0
    """No rank advancing for this long is a stall: the stage is cancelled, naming the stalled rank and step."""
    barrier_seconds: int = 3600
    """Bound on loading and collective start-up: the driver's monitor cancels the stage when a rank is not
    past them by then (applies to library callers too). The CLI also sets spark.barrier.sync.timeout
    from it when it creates the session; that Spark setting cannot change on a running SparkContext."""

    def __post_init__(self) -> None:
        _positive("timeouts.step_seconds", self.step_seconds)
        _positive("timeouts.barrier_seconds", self.barrier_seconds)


@dataclass(kw_only=True)
class FaultSettings:
    """Fault injection for tests and demos; off by default."""

    kill_rank: int | None = None
    """Rank that fails at `at_step` (in the first `repeat` attempts)."""
    at_step: int = 0
    """Step (0-based, global) at which `kill_rank` fails."""
    mode: FaultMode = "exit"
    """exit: the Python worker process dies; raise: an exception; hang: the rank stops making progress;
    executor: the rank's executor JVM is killed (a lost executor or node; cluster masters only)."""
    repeat: int = 1
    """In how many attempts (the first one and restarts) the fault fires."""

    slow_rank: int | None = None
    """Rank that sleeps `slow_ms` in every compute phase (a simulated straggler)."""
    slow_ms: float = 0.0
    """Extra compute milliseconds per step on `slow_rank` (a fixed delay: no batch size balances it)."""
    slow_factor: float = 1.0
    """`slow_rank`'s compute takes this many times as long (it sleeps (factor - 1) x each step's measured
    compute, and so in the `balance: speed` probe): a slower machine, per row. 1: off."""

    def __post_init__(self) -> None:
        _positive("faults.slow_ms", self.slow_ms, allow_zero=True)
        if not self.slow_factor >= 1.0:
            raise ValueError(f"faults.slow_factor={self.slow_factor!r} must be >= 1 (2: the rank computes at half "
                             "speed; 1: off).")
        if self.slow_rank is None and (self.slow_factor != 1.0 or self.slow_ms):
            raise ValueError("faults.slow_factor and faults.slow_ms slow down faults.slow_rank, which is unset: "
                             "name the rank to slow down, or leave them at their defaults.")
        _choice("faults.mode", self.mode, get_args(FaultMode))
        _positive("faults.at_step", self.at_step, allow_zero=True)
        _positive("faults.repeat", self.repeat)
        if self.kill_rank is not None and self.kill_rank < 0:
            raise ValueError(f"faults.kill_rank={self.kill_rank} must be a rank >= 0 (or null).")
        if self.slow_rank is not None and self.slow_rank < 0:
            raise ValueError(f"faults.slow_rank={self.slow_rank} must be a rank >= 0 (or null).")


@dataclass(kw_only=True)
class TrainConfig:
    """Everything the barrier stage needs, as plain values."""

    num_workers: int = 4
    """Number of blocks and of barrier tasks (one Horovod rank each)."""
    blocks: BlockSource = "auto"
    """How blocks are cut. `shuffle`: Spark cuts content-hashed balanced blocks from any DataFrame
    (`make_blocks`, two shuffles). `files`: each worker reads its balanced row range of Parquet files
    itself, no shuffle (`train_files`). `auto`: `files` when `train` is given a plain scan of Parquet
    files (`scan.parquet_scan_files`: spark.read.parquet, optionally narrowed to columns) and no
    validation rows are asked for, else `shuffle`; `metrics.json` `blocks` says which ran."""
    block_storage: BlockStorage = "auto"
    """Where each worker keeps its block (see `block_store`). `memory`: in RAM (on the GPU, when
    training there). `disk`: unnamed files in the executor's Spark local directory, read step by step,
    resident memory bounded by `memory_budget_mb`; bitwise the same result. `auto`: `disk` when a
    block is over half the memory the driver knows a Python worker has (`spark.executor.pyspark.memory`
    per core, or in local mode this machine's available memory per worker), else `memory`. `stream`
    (blocks=files, epoch_order=chunks): nothing is copied; every epoch each worker reads its rows
    straight from the Parquet files, window by window in the chunk order (`stream_block`), so the data
    may exceed the executors' memory and local disks alike."""
    balance: BalanceMode = "even"
    """How many rows each block gets. `even`: sizes differ by at most one row. `speed`: before the blocks are
    cut, a short barrier stage times every rank's training steps on synthetic batches of the real shapes
    (the `probe` start-up phase) at two batch sizes, and block sizes follow the rows per second each rank
    is predicted at the batch that equalizes the predicted step times (a fixed cost a step plus a cost a
    row: `engine.balance.balanced_speeds`; largest remainders, `engine.balance.weighted_sizes`); local
    batches follow block sizes, so each step's global batch keeps its size and a slower rank gets fewer rows
    per step. Speeds within 10% of each other cut exactly as
    `even` (`engine.balance.SPEED_TOLERANCE`). With blocks=files each rank reads the block cut for the executor
    it runs on (Spark may place the probe's task i elsewhere than training's); with blocks=shuffle a rank on
    another executor is named (`balance.misplaced_ranks`). Saved with checkpoints: a relaunch cuts the same."""
    memory_budget_mb: int = 256
    """With block_storage=disk: the most of the mapped block a worker keeps resident at once. With
    epoch_order=chunks it also sizes the shuffle window (see `shuffle_window_mb`)."""
    epoch_order: EpochOrderName = "global"
    """The order a worker visits its block in each epoch, seeded by (seed, rank, epoch) either way.
    `global`: one permutation of the whole block (each step's rows lie anywhere in it). `chunks`: the
    block's chunks of `chunk_mb` are permuted and rows are shuffled within windows of consecutive chunks
    (`shuffle_window_mb`), so a block on disk is read sequentially, a window ahead of the step that
    needs it (the rule: `blocksync.engine.worker.epoch_order.chunk_order`, and the README). Every
    storage mode gives the same result for the same order. `auto` (`driver.storage.resolve_order`): `chunks`
    where a block is read from storage (disk or stream) and is larger than `memory_budget_mb`, so that the
    page cache may not hold it, else `global`."""
    chunk_mb: float = 4.0
    """With epoch_order=chunks: the size of a chunk, the unit read sequentially and permuted (MiB of
    stored rows: 4 bytes a feature, 8 a label, an id or a weight)."""
    shuffle_window_mb: float | None = None
    """With epoch_order=chunks: the MiB of rows shuffled together (rounded down to whole chunks, at least
    one); None: half of `memory_budget_mb` less one local batch (and with block_storage=stream, less 3x
    the files' largest row group, which decoding holds), so that the window trained on and the next one,
    read meanwhile, fit in the budget with one batch."""
    backend: Backend = "horovod"
    """Collective used for the block sync: horovod (Gloo/NCCL), torch_gloo, or spark
    (BarrierTaskContext.allGather; only for tiny models). `auto`: chosen on the driver before launch
    (`driver.backend_choice`): horovod for GPU tasks with a Horovod built with NCCL, else torch_gloo,
    which trains faster than Horovod 0.28.1 on CPUs; the choice and its reason are logged, and
    metrics.json `backend` records it."""
    sync: SyncMode = "gradients"
    """`gradients`: all-reduce gradients every step. `parameters`: K local steps, then
    average parameters (local SGD / federated averaging)."""
    sync_every: int = 1
    """K for `sync: parameters`."""
    task: TaskKind = "classification"
    """Loss: cross-entropy over `num_classes`, or mean squared error (unless `loss` names another)."""
    loss: str | None = None
    """A custom loss as an import path `package.module:fn`: fn(outputs, labels) returns the loss SUMMED
    over the batch's rows (contract and driver-side probe: `blocksync.engine.losses`); None: the task's."""
    label_smoothing: float = 0.0
    """Classification's cross-entropy with smoothed targets, as torch.nn.CrossEntropyLoss(label_smoothing):
    1 - eps on the label, eps spread over all classes; in [0, 1). The validation loss uses it too."""
    num_classes: int | None = None
    """Output width for classification; None: derived from the labels."""
    model: ModelSpec = field(default_factory=ModelSpec)
    """The network."""
    epochs: int = 10
    """Passes over every block."""
    batch_size: int = 128
    """Global batch size per step, split across workers in proportion to block sizes."""
    optimizer: OptimizerName = "adam"
    """Optimizer, identical on every replica."""
    lr: float = 1e-3
    """Peak learning rate."""
    momentum: float = 0.9
    """SGD momentum (ignored by Adam)."""
    weight_decay: float = 0.0
    """L2 penalty (decoupled for adamw)."""
    schedule: ScheduleName = "constant"
    """Learning-rate schedule over all steps."""
    warmup_steps: int = 0
    """Linear warm-up steps before the schedule."""
    validation_fraction: float = 0.0
    """Share of the rows held out (content-hashed with the seed) for a validation loss and metric after each
    epoch, computed by every rank on its held-out rows and all-reduced; 0: none (or pass train(validation=COL))."""
    early_stopping_patience: int = 0
    """With validation: stop after this many epochs without a lower validation loss and return the weights
    of the epoch with the lowest one (every rank decides on the same all-reduced loss); 0: off."""
    seed: int = 0
    """Seeds model init (rank 0, then broadcast), block assignment and per-epoch shuffles."""
    check_every: int = 50
    """Steps between replica-consistency checks (parameter digests allGathered); 0: only at the end.
    With sync=parameters a check falls on the first averaging step at or after each multiple."""
    device: DeviceName = "auto"
    """`auto`: the GPU Spark assigned to the task if CUDA is usable, else CPU."""
    mixed_precision: MixedPrecision = "none"
    """`bf16`: forward pass under torch.autocast in bfloat16 (CPU and GPU; no loss scaling needed).
    Gradients, the exchange and the optimizer stay float32, so replicas stay identical."""
    threads_per_worker: int | None = None
    """torch intra-op threads per worker; None: spark.task.cpus."""
    gloo_timeout_seconds: int = 60
    """Gloo rendezvous timeout; collectives use max(this, timeouts.step_seconds + 30) so the driver's
    stall watchdog reports first (HOROVOD_GLOO_TIMEOUT_SECONDS, torch_gloo timeout)."""
    network_interface: str | None = None
    """NIC for Gloo; None: the interface that holds the task's own address (lo on 127.0.0.1)."""
    shard: Shard = "none"
    """`none`: every rank holds the whole optimizer state (replicated). `optimizer` (ZeRO stage 1): the
    gradients are reduce-scattered, each rank steps only its contiguous 1/num_workers slice of the flat
    parameters with only that slice's optimizer state, and the updated slices are all-gathered, so every
    replica holds the same parameters before the next forward pass. Needs sync=gradients,
    compression=none and backend horovod or torch_gloo (README, "Sharded optimizer state")."""
    compression: Compression = "none"
    """Gradient compression: none, fp16, topk (with error feedback), int8 (stochastic, error feedback),
    powersgd (low-rank, error feedback; all-reduced, so its bytes per rank do not grow with workers)."""
    overlap: bool | None = None
    """Gradient sync in buckets whose all-reduces start during backward, as each bucket's gradients are
    ready (`engine.comm.buckets`); the buckets are cut from the parameters' order and sizes, so results
    stay bitwise reproducible. It runs with sync=gradients, backend horovod or torch_gloo, compression
    none or fp16. None (default): on wherever it can run (it measured faster on the CPU on both
    backends, benchmarks/results/bigmodel.md) except with shard=optimizer, off elsewhere; true: on, refusing
    a setting it cannot run with (with shard=optimizer the buckets are all-reduced whole and each rank keeps
    its slice, the fallback's bytes, and their buffers hold a copy of the gradients); false: off.
    metrics.json `overlap` says whether it ran (`overlaps`)."""
    bucket_mb: float = 4.0
    """With overlap: the size (MiB of float32 gradients) at which a bucket closes."""
    topk_ratio: float = 0.01
    """Share of gradient entries each rank sends per step with compression=topk."""
    powersgd_rank: int = 4
    """Rank of each weight matrix's approximation with compression=powersgd."""
    straggler_factor: float = 1.5
    """A rank whose median compute time exceeds the ranks' median by this factor is reported a straggler."""
    straggler_min_ms: float = 1.0
    """...and by at least this many milliseconds (sub-millisecond jitter is not a straggler)."""
    horovod: HorovodSettings = field(default_factory=HorovodSettings)
    """Horovod tuning knobs."""
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    """Periodic checkpoints, which restarts resume from."""
    max_restarts: int = 0
    """Relaunches of the barrier stage after a worker failure or stall (each resumes from the latest checkpoint)."""
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    """Stall detection."""
    faults: FaultSettings = field(default_factory=FaultSettings)
    """Fault injection (tests, demos)."""

    def __post_init__(self) -> None:
        self._nest_sections()
        self._check_faults_and_compression()
        self._check_choices_and_ranges()

    def _nest_sections(self) -> None:
        """YAML and keyword callers pass the sections as dicts."""
        if isinstance(self.model, dict):
            self.model = ModelSpec(**self.model)
        if isinstance(self.horovod, dict):
            self.horovod = HorovodSettings(**self.horovod)
        if isinstance(self.faults, dict):
            self.faults = FaultSettings(**self.faults)
        if isinstance(self.checkpoint, dict):
            self.checkpoint = CheckpointSettings(**self.checkpoint)
        if isinstance(self.timeouts, dict):
            self.timeouts = TimeoutSettings(**self.timeouts)

    def _check_faults_and_compression(self) -> None:
        _positive("max_restarts", self.max_restarts, allow_zero=True)
        if self.faults.kill_rank is not None and self.faults.kill_rank >= self.num_workers:
            raise ValueError(f"faults.kill_rank={self.faults.kill_rank} but num_workers={self.num_workers}.")
        _choice("compression", self.compression, COMPRESSIONS)
        _choice("mixed_precision", self.mixed_precision, get_args(MixedPrecision))
        if not 0.0 < self.topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio={self.topk_ratio} must be in (0, 1].")
        if self.powersgd_rank < 1:
            raise ValueError(f"powersgd_rank={self.powersgd_rank} must be at least 1.")
        if self.straggler_factor <= 1.0:
            raise ValueError(f"straggler_factor={self.straggler_factor} must be > 1.")
        if self.compression != "none" and self.sync == "parameters":
            raise ValueError(
                f"compression={self.compression!r} applies to gradient sync; with sync='parameters' "
                "set compression=none (parameter averaging sends full parameters)."
            )
        if self.faults.slow_rank is not None and self.faults.slow_rank >= self.num_workers:
            raise ValueError(f"faults.slow_rank={self.faults.slow_rank} but num_workers={self.num_workers}.")
        self._check_overlap()

    @property
    def overlaps(self) -> bool:
        """Whether the gradient buckets are overlapped with backward in this run (`overlap` resolved)."""
        if self.overlap is not None:
            return self.overlap
        return (self.sync == "gradients" and self.backend != "spark" and self.compression in ("none", "fp16")
                and self.shard == "none")

    def _check_overlap(self) -> None:
        _positive("bucket_mb", self.bucket_mb)
        if not self.overlap:
            return
        if self.sync != "gradients":
            raise ValueError("overlap=true overlaps the gradient all-reduce with backward, and sync='parameters' "
                             "averages parameters after steps: set overlap=false or sync=gradients.")
        if self.backend == "spark":
            raise ValueError("overlap=true needs an asynchronous all-reduce, and backend='spark' blocks in "
                             "BarrierTaskContext.allGather: set overlap=false or backend=horovod or torch_gloo.")
        if self.compression not in ("none", "fp16"):
            raise ValueError(f"overlap=true reduces each bucket on its own, and compression={self.compression!r} "
                             "compresses the whole gradient at once (its selection and error feedback span every "
                             "bucket): set overlap=false or compression=none or fp16.")

    def _check_choices_and_ranges(self) -> None:
        _choice("backend", self.backend, BACKENDS)
        _choice("blocks", self.blocks, BLOCK_SOURCES)
        _choice("block_storage", self.block_storage, BLOCK_STORAGES)
        _choice("balance", self.balance, get_args(BalanceMode))
        _choice("epoch_order", self.epoch_order, get_args(EpochOrderName))
        _positive("chunk_mb", self.chunk_mb)
        if self.shuffle_window_mb is not None:
            _positive("shuffle_window_mb", self.shuffle_window_mb)
        _choice("sync", self.sync, SYNC_MODES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("device", self.device, DEVICES)
        _choice("task", self.task, TASKS)
        for name in ("num_workers", "sync_every", "epochs", "batch_size", "gloo_timeout_seconds", "memory_budget_mb"):
            _positive(name, getattr(self, name))
        _positive("lr", self.lr)
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction={self.validation_fraction} must be in [0, 1).")
        _positive("early_stopping_patience", self.early_stopping_patience, allow_zero=True)
        if self.early_stopping_patience and self.sync == "parameters":
            raise ValueError("early_stopping_patience needs sync=gradients: with sync=parameters the replicas "
                             "differ between averages, so an epoch's weights are not one model.")
        if self.block_storage == "stream" and (self.epoch_order == "global" or self.blocks == "shuffle"):
            raise ValueError(f"block_storage=stream reads each block from its Parquet files in the chunk order: set "
                             f"train.epoch_order=chunks (now {self.epoch_order}) and train from Parquet files "
                             f"(blocks=files or auto; now {self.blocks}), or use block_storage=disk.")
        if self.blocks == "files" and (self.validation_fraction or self.early_stopping_patience):
            raise ValueError("validation_fraction and early_stopping_patience hold rows out while Spark cuts the "
                             "blocks: set blocks=shuffle, or set them to 0.")
        _positive("warmup_steps", self.warmup_steps, allow_zero=True)
        _positive("check_every", self.check_every, allow_zero=True)
        _positive("weight_decay", self.weight_decay, allow_zero=True)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum={self.momentum} must be in [0, 1).")
        if self.num_classes is not None and self.num_classes < 2:
            raise ValueError(f"num_classes={self.num_classes} must be >= 2 (or null to derive it).")
        if self.threads_per_worker is not None:
            _positive("threads_per_worker", self.threads_per_worker)
        if self.loss is not None and (not isinstance(self.loss, str) or ":" not in self.loss):
            raise ValueError(f"loss={self.loss!r} is not an import path 'package.module:fn'; leave it unset for "
                             "cross-entropy (classification) or MSE (regression).")
        self._check_label_smoothing()
        self._check_shard()

    def _check_shard(self) -> None:
        if self.shard == "gradients":
            raise ValueError("shard='gradients' (ZeRO stage 2) is not implemented: every rank keeps its whole "
                             "gradient; use shard=optimizer (ZeRO stage 1), or shard=none.")
        _choice("shard", self.shard, SHARDS)
        if self.shard == "none":
            return
        if self.backend == "spark":
            raise ValueError(f"shard={self.shard!r} with backend='spark': the spark backend has no reduce-scatter "
                             "and sends every byte through the driver; use backend=horovod or torch_gloo, or "
                             "shard=none.")
        if self.sync == "parameters":
            raise ValueError(f"shard={self.shard!r} with sync='parameters': local SGD steps every replica on its "
                             "own gradient with its own optimizer state, so there is no shared state to split; "
                             "use sync=gradients, or shard=none.")
        if self.compression != "none":
            why = {"topk": "all-gathers every rank's sparse contribution whole, so there is nothing to scatter",
                   "int8": "all-gathers every rank's quantized contribution whole, so there is nothing to scatter",
                   "powersgd": "all-reduces low-rank factors of whole matrices, which no slice holds",
                   "fp16": "would need a float16 reduce-scatter, which blocksync does not implement"}[self.compression]
            raise ValueError(f"shard={self.shard!r} with compression={self.compression!r}: that compression {why}; "
                             "use compression=none, or shard=none.")

    def _check_label_smoothing(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing} must be in [0, 1) (0.1 is the usual value; "
                             "0: plain cross-entropy).")
        if self.label_smoothing and self.task != "classification":
            raise ValueError(f"label_smoothing={self.label_smoothing} smooths class targets, and task={self.task!r} "
                             "has none: set label_smoothing=0.")
        if self.label_smoothing and self.loss is not None:
            raise ValueError(f"label_smoothing={self.label_smoothing} applies to the built-in cross-entropy, and "
                             f"loss={self.loss!r} replaces it: smooth inside that loss, or set label_smoothing=0.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_custom(spec: ModelSpec) -> bool:
    """True when `spec` names an import path: building it imports and runs that code."""
    return spec.name not in REGISTRY
