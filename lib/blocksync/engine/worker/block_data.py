"""Worker side: Arrow record batches to NumPy arrays (a batch at a time), and the seeded batch plan.

Pure functions over Arrow and NumPy: tests call them without Spark, and the
single-process reference loop in the tests uses the same `batch_slices` and
`epoch_permutation` to rebuild the global batches the workers step on.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from blocksync.engine.inputs import FEATURES, IDS, LABEL, WEIGHT


def batch_arrays(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float32 [k, d], ids int64 [k, i], targets float64) of one incoming batch: fresh, writable
    arrays. Ids are the typed inputs' (`inputs`; i = 0 without them).

    Targets are the labels [k], or with a `weight` column (label, weight) pairs [k, 2]."""
    x = _matrix(batch, FEATURES, np.float32, "features")
    ids = _matrix(batch, IDS, np.int64, "ids") if IDS in batch.schema.names else np.zeros((batch.num_rows, 0),
                                                                                           np.int64)
    y = batch.column(batch.schema.get_field_index(LABEL)).to_numpy(zero_copy_only=False).astype(np.float64)
    if WEIGHT in batch.schema.names:
        w = batch.column(batch.schema.get_field_index(WEIGHT)).to_numpy(zero_copy_only=False).astype(np.float64)
        y = np.stack([y, w], axis=1)
    return x, ids, y


def _matrix(batch: pa.RecordBatch, column: str, dtype: type, what: str) -> np.ndarray:
    """A list column of equal-length rows as a [rows, length] array of `dtype` (a writable copy)."""
    values = batch.column(batch.schema.get_field_index(column))
    if values.null_count:
        raise ValueError(f"{values.null_count} rows have null {what}")
    lengths = pc.list_value_length(values)
    low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if low != high:
        raise ValueError(f"the {what} arrays have lengths {low}..{high}; every row needs the same number of values.")
    flat = values.flatten().to_numpy(zero_copy_only=False).astype(dtype)  # a copy: int64 ids stay int64
    return np.ascontiguousarray(flat.reshape(batch.num_rows, high or 0))


def split_targets(y: np.ndarray | torch.Tensor) -> tuple:
    """(labels, weights or None) of a targets array: [n] labels, or [n, 2] (label, weight) pairs."""
    if y.ndim == 2:
        return y[:, 0], y[:, 1]
    return y, None


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
