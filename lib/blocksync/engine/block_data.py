"""Worker side: Arrow record batches to one tensor block, and the seeded batch plan.

Pure functions over Arrow and NumPy: tests call them without Spark, and the
single-process reference loop in the tests uses the same `batch_slices` and
`epoch_permutation` to rebuild the global batches the workers step on.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from blocksync.engine.blocks import FEATURES, LABEL


def arrow_to_block(batches: Iterable[pa.RecordBatch]) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [n, d], labels float64 [n]) from the partition's batches, no per-row Python."""
    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return np.zeros((0, 0), dtype=np.float32), np.zeros((0,), dtype=np.float64)
    feats = table.column(FEATURES).combine_chunks()
    if feats.null_count:
        raise ValueError(f"{feats.null_count} rows have null features")
    values = feats.flatten().to_numpy(zero_copy_only=False).astype(np.float32)  # a writable copy
    n = table.num_rows
    x = np.ascontiguousarray(values.reshape(n, -1))
    y = table.column(LABEL).to_numpy().astype(np.float64)
    return x, y


def steps_per_epoch(total_rows: int, batch_size: int) -> int:
    """Same on every worker: computed from the global row count before launch."""
    return max(1, -(-total_rows // batch_size))


def epoch_permutation(block_size: int, seed: int, rank: int, epoch: int) -> np.ndarray:
    """The order in which a worker visits its block in one epoch."""
    rng = np.random.default_rng([seed, rank, epoch])
    return rng.permutation(block_size)


def batch_slices(block_size: int, num_steps: int) -> list[tuple[int, int]]:
    """Cut one epoch of a block into `num_steps` contiguous slices of near-equal size.

    Every worker takes the same number of steps per epoch whatever its block
    size, so local batches are proportional to block sizes and the
    count-weighted average of local gradients is the gradient of the global
    batch. A block smaller than the step count yields some empty slices; the
    worker still joins those all-reduces with a zero weight.
    """
    edges = [(s * block_size) // num_steps for s in range(num_steps + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))
