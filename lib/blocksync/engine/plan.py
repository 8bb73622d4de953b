"""What the driver hands every worker: plain, picklable values resolved before launch.

`WorkerPlan` is all a barrier task needs (the config, block sizes, the schedule, where blocks are
kept); `ShardPlan` and `Piece` say which Parquet row ranges each rank reads itself with
blocks=files (`driver.shards` makes them, `worker.shard_reader` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow.fs as pafs

from blocksync.engine.config import TrainConfig
from blocksync.engine.inputs import InputSpec


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one row group of one file."""

    path: str
    row_group: int
    start: int
    stop: int


@dataclass(frozen=True)
class ShardPlan:
    """What every worker needs to read its block: the filesystem and, per rank, its pieces."""

    filesystem: pafs.FileSystem
    features: list[str]
    """One array column, or numeric columns stacked in this order."""
    label: str
    pieces: list[list[Piece]]
    weight: str | None = None
    """A numeric column of per-row weights; targets are then (label, weight) pairs."""
    file_facts: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """path -> (size in bytes, modification time in ns or None) as the driver found them with the footers:
    block_storage=stream checks every file against them before it reads it."""
    largest_group_bytes: int = 0
    """The largest row group's bytes, uncompressed (all its columns, from the footers): block_storage=stream
    decodes one at a time, and its budget counts that (`epoch_order.chunk_layout`)."""


@dataclass(frozen=True)
class ChunkLayout:
    """How train.epoch_order=chunks cuts a block (`worker.epoch_order`): `chunk_rows` consecutive rows a
    chunk, `window_chunks` chunks a shuffle window."""

    chunk_rows: int
    window_chunks: int

    @property
    def window_rows(self) -> int:
        return self.chunk_rows * self.window_chunks


@dataclass(frozen=True)
class WorkerPlan:
    """Everything a worker needs, resolved by the driver into plain values."""

    config: TrainConfig
    num_features: int
    num_outputs: int
    total_rows: int
    steps_per_epoch: int
    monitor_address: str | None = None
    """host:port of the driver's RunMonitor (heartbeats from every rank, progress from rank 0), or None."""
    attempt: int = 0
    """0 for the first launch, then 1, 2, ... for relaunches after a failure."""
    resume_from: str | None = None
    """Checkpoint folder to resume from (validated by the driver), or None to start fresh."""
    shards: ShardPlan | None = None
    """blocks=files: each rank reads its rows of the Parquet files itself (`shards`); None: the
    task's input partition is its block."""
    block_rows: list[int] | None = None
    """Rows of each rank's block, as the driver counted them (memory mode allocates the block once)."""
    val_rows: list[int] | None = None
    """Held-out validation rows of each rank, after its `block_rows` in the partition; None: no validation."""
    storage: str = "memory"
    """`memory` or `disk`: train.block_storage, with `auto` resolved by the driver (`storage`)."""
    weighted: bool = False
    """Rows carry a weight (targets are (label, weight) pairs): the loss is the weighted sum over the
    global batch divided by its summed weights."""
    launched_at: float = 0.0
    """time.time() on the driver as it submitted this attempt's stage (`startup`); 0: unknown."""
    chunks: ChunkLayout | None = None
    """train.epoch_order=chunks: the chunk and window sizes every rank cuts its block by (the driver
    fixes them from the row width, `chunk_mb` and the budget); None: the global permutation."""
    inputs: InputSpec | None = None
    """Typed inputs (`num_features` is the width of the numeric ones, `id_width` of the id ones); None:
    one feature matrix."""
    balance: dict | None = None
    """`balance: speed`: the measured speeds and hosts the blocks were cut by (saved with checkpoints);
    None: even blocks."""

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.config.epochs

    @property
    def id_width(self) -> int:
        return self.inputs.id_width if self.inputs is not None else 0

    @property
    def target_columns(self) -> int:
        """Float64 targets per row: the label, and its weight when rows are weighted."""
        return 2 if self.weighted else 1
