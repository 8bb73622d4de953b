"""Driver side of `train.block_storage`: how large each block is, what memory a Python worker has, and
so where the blocks go, checked before launch.

A block's bytes are rows x (4 x features + 8): float32 features and a float64 label,
the same in memory and on disk, plus 8 a row for each int64 id (typed inputs) and for a
float64 row weight (`block_store.storage_width` counts each as two float32 columns).
The memory a Python worker may use is known on the driver only in two cases:
`spark.executor.pyspark.memory` (which Spark divides among an executor's cores
and enforces on each Python worker), and local mode, where the workers share
this machine's available memory. `auto` picks `disk`
when a block is over AUTO_SHARE of that memory; `memory` refuses a block that
cannot fit at all, before launch.
"""

from __future__ import annotations

import logging
import math

from pyspark.sql import SparkSession

from blocksync.engine.config import TrainConfig
from blocksync.engine.driver.spark_facts import is_connect, is_local
from blocksync.engine.plan import ChunkLayout
from blocksync.engine.worker.block_store import min_budget_bytes, row_bytes
from blocksync.engine.worker.epoch_order import (
    chunk_layout,
    fewest_window_chunks,
    smallest_window_rows,
    window_budget_bytes,
)

log = logging.getLogger(__name__)

AUTO_SHARE = 0.5
"""`auto` keeps a block in memory up to this share of a worker's memory: the rest is for torch,
the model, the optimizer and the batch."""


def _bytes(setting: str) -> int:
    """Spark's size notation (512m, 2g, 1024k, plain MiB) in bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = setting.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text) * 2**20)


def worker_memory(spark: SparkSession | None, num_workers: int) -> tuple[int, str] | None:
    """(bytes, where the figure comes from) of memory one Python worker may use, when the driver knows."""

    if spark is None or is_connect(spark):
        return None
    conf = spark.sparkContext.getConf()
    pyspark_memory = conf.get("spark.executor.pyspark.memory", None)
    if pyspark_memory:
        cores = int(conf.get("spark.executor.cores", "1") or 1)
        per_worker = _bytes(pyspark_memory) // max(cores, 1)
        return per_worker, f"spark.executor.pyspark.memory={pyspark_memory} over {cores} core(s)"
    if is_local(spark):
        import psutil

        available = psutil.virtual_memory().available
        return available // num_workers, f"this machine's available memory ({available / 2**30:.1f} GiB) " \
                                          f"over {num_workers} local workers"
    return None


def resolve_storage(config: TrainConfig, block_rows: list[int], num_features: int, steps_per_epoch: int,
                    memory: tuple[int, str] | None, has_files: bool = False) -> str:
    """`memory`, `disk` or `stream` (only when blocks are read from files: `has_files`) for every rank;
    raises ValueError (exit 2) for a block that cannot work."""
    largest = max(block_rows, default=0) * row_bytes(num_features)
    storage = config.block_storage
    if storage == "auto":
        storage = "disk" if memory is not None and largest > AUTO_SHARE * memory[0] else "memory"
        if memory is None:
            log.info("block_storage=auto: the driver does not know the Python workers' memory "
                     "(set spark.executor.pyspark.memory); keeping blocks in memory")
    if storage == "stream" and not has_files:
        raise ValueError("block_storage=stream reads each block from Parquet files, and this run's blocks come from "
                         "a Spark shuffle: train from Parquet files (train_files, or a plain spark.read.parquet "
                         "scan with blocks=auto or files), or use block_storage=disk.")
    if storage == "memory" and memory is not None and largest > memory[0]:
        raise ValueError(
            f"block_storage=memory: the largest block holds {largest / 2**20:,.0f} MiB but a Python worker has "
            f"{memory[0] / 2**20:,.0f} MiB ({memory[1]}); set train.block_storage=disk (or auto), or raise "
            "num_workers so that each block is smaller."
        )
    if storage == "disk" and resolve_order(config, block_rows, num_features, storage) == "global":  # else chunks
        local_batch = math.ceil(max(block_rows, default=0) / steps_per_epoch)
        needed = min_budget_bytes(local_batch, num_features)
        if config.memory_budget_mb * 2**20 < needed:
            raise ValueError(
                f"train.memory_budget_mb={config.memory_budget_mb} cannot hold one local batch of {local_batch} "
                f"rows read from disk; it needs at least {math.ceil(needed / 2**20)}."
            )
    return storage


def _mib(size: float) -> str:
    """Bytes as MiB for a message, rounded up (to 0.001 below 1 MiB, else to a whole MiB)."""
    mib = size / 2**20
    return f"{math.ceil(mib * 1000) / 1000:g}" if mib < 1 else f"{math.ceil(mib)}"


def resolve_order(config: TrainConfig, block_rows: list[int], num_features: int, storage: str) -> str:
    """`global` or `chunks`; `epoch_order=auto` picks `chunks` for blocks read from storage (disk, stream)
    larger than `memory_budget_mb`: under a 512 MiB cgroup limit a 2 GiB block on disk trained at 14k
    samples/s in the global order (a page fault a row) and 0.5 M in the chunk order; where the block fits
    (in memory, or a disk block within the budget), `global` keeps the seeded results and was as fast
    (benchmarks/results/memory_limit.md and epoch_order.md)."""
    if config.epoch_order != "auto":
        return config.epoch_order
    largest = max(block_rows, default=0) * row_bytes(num_features)
    large = largest > config.memory_budget_mb * 2**20
    return "chunks" if storage == "stream" or (storage == "disk" and large) else "global"


def resolve_chunks(config: TrainConfig, block_rows: list[int], num_features: int, steps_per_epoch: int,
                   storage: str, largest_group_bytes: int = 0) -> ChunkLayout | None:
    """epoch_order=chunks: the layout every rank cuts its block by (`epoch_order.chunk_layout`); None for
    the global order. A reader from storage holds two windows and one local batch, each window at least
    a local batch, and streaming, one row group being decoded (3 x `largest_group_bytes`): a budget (or
    window) too small for that is refused before launch, naming the minimum."""
    width = row_bytes(num_features)
    if resolve_order(config, block_rows, num_features, storage) != "chunks":
        if storage == "disk" and max(block_rows, default=0) * width > config.memory_budget_mb * 2**20:
            log.info("block_storage=disk with blocks larger than train.memory_budget_mb: each step reads its rows at "
                     "random positions of the block; where the page cache cannot hold the block (a container's "
                     "limit), train.epoch_order=chunks reads it sequentially instead")
        return None
    local = math.ceil(max(block_rows, default=0) / steps_per_epoch)
    decode = 3 * largest_group_bytes if storage == "stream" else 0
    layout = chunk_layout(width, config.chunk_mb, config.memory_budget_mb, config.shuffle_window_mb, local, decode)
    if storage == "memory":  # the order only: nothing is read
        return layout
    fewest = ChunkLayout(layout.chunk_rows, fewest_window_chunks(layout.chunk_rows, block_rows, local))
    short = smallest_window_rows(layout, block_rows) < local  # with a block's short last chunk, maybe
    if config.shuffle_window_mb is not None and short:
        raise ValueError(
            f"train.shuffle_window_mb={config.shuffle_window_mb:g} holds {layout.window_rows} rows, fewer than one "
            f"local batch of {local} rows (with a block's short last chunk); raise it to at least "
            f"{_mib(fewest.window_rows * width)}, or leave it unset."
        )
    needed = window_budget_bytes(layout, width, local, decode)
    if short or needed > config.memory_budget_mb * 2**20:
        if config.shuffle_window_mb is None:  # the smallest window: the fewest whole chunks that hold a batch
            needed = window_budget_bytes(fewest, width, local, decode)
        decoding = f", and decoding a row group of the files ({_mib(decode)} MiB)," if decode else ""
        raise ValueError(
            f"train.memory_budget_mb={config.memory_budget_mb} cannot hold two shuffle windows (the one trained "
            f"on and the next, read meanwhile) and one local batch of {local} rows{decoding} with "
            f"epoch_order=chunks and block_storage={storage}; it needs at least {_mib(needed)}."
        )
    return layout
