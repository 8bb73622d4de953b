"""The order in which a rank visits its block in an epoch (`train.epoch_order`): `global` (one seeded
permutation of the whole block) or `chunks` (a seeded two-level order that reads the block sequentially,
chunk by chunk, and shuffles rows within a window of chunks that fits the memory budget).

Both are pure functions of (seed, rank, epoch) and of the layout the driver fixes before launch, so
every storage mode visits the same rows in the same order and a relaunch resumes bitwise. The rule is
written out once, in `chunk_order`'s docstring (and the README); `tests/reference.py` rebuilds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blocksync.engine.plan import ChunkLayout
from blocksync.engine.worker.block_data import epoch_permutation


def chunk_layout(row_bytes: int, chunk_mb: float, memory_budget_mb: float, window_mb: float | None,
                 local_batch_rows: int, decode_bytes: int = 0) -> ChunkLayout:
    """The layout for rows of `row_bytes` bytes as stored (4 a float32 feature, 8 an int64 id, 8 a float64
    target or weight):

    - chunk_rows = max(1, floor(chunk_mb x 2^20) // row_bytes);
    - window bytes W = floor(shuffle_window_mb x 2^20), or unset: (floor(memory_budget_mb x 2^20) - L x
      row_bytes - D) // 2 with L = ceil(largest block / steps per epoch), the largest local batch: a reader
      holds the window being trained and the next one being read, and one local batch; D (`decode_bytes`)
      is 0, except with block_storage=stream: 3 x the largest row group's bytes (uncompressed, from the
      footers), what decoding one row group holds (the column chunk read, the decoded table, its copy);
    - window_chunks = max(1, W // (chunk_rows x row_bytes))."""
    chunk_rows = max(1, math.floor(chunk_mb * 2**20) // row_bytes)
    if window_mb is not None:
        window_bytes = math.floor(window_mb * 2**20)
    else:
        window_bytes = (math.floor(memory_budget_mb * 2**20) - local_batch_rows * row_bytes - decode_bytes) // 2
    return ChunkLayout(chunk_rows, max(1, window_bytes // (chunk_rows * row_bytes)))


def window_budget_bytes(layout: ChunkLayout, row_bytes: int, local_batch_rows: int, decode_bytes: int = 0) -> int:
    """What a rank reading in `chunks` order holds at once: two windows (the one it trains on, the next
    one being read), one local batch and, streaming, one row group being decoded (`decode_bytes`)."""
    return (2 * layout.window_rows + local_batch_rows) * row_bytes + decode_bytes


def smallest_window_rows(layout: ChunkLayout, block_rows: list[int]) -> int:
    """The fewest rows a window other than an epoch's last can hold: one of its chunks may be a block's
    short last chunk (n mod chunk_rows rows). A reader holding two windows serves any step only if these
    hold a local batch each (a step's rows then lie in at most two windows)."""
    return min(((layout.window_chunks - 1) * layout.chunk_rows + (n % layout.chunk_rows or layout.chunk_rows)
                for n in block_rows if n > layout.window_rows), default=layout.window_rows)


def fewest_window_chunks(chunk_rows: int, block_rows: list[int], local_batch_rows: int) -> int:
    """The fewest chunks a window needs so that `smallest_window_rows` holds a local batch."""
    chunks = max(1, math.ceil(local_batch_rows / chunk_rows))
    while smallest_window_rows(ChunkLayout(chunk_rows, chunks), block_rows) < local_batch_rows:
        chunks += 1  # at most once: one more whole chunk holds the batch
    return chunks


@dataclass(frozen=True)
class Window:
    """Positions [start, start + rows) of an epoch: the rows of `chunks`, concatenated in that order,
    then visited in the order `shuffle` (a permutation of range(rows))."""

    start: int
    chunks: np.ndarray
    shuffle: np.ndarray

    @property
    def stop(self) -> int:
        return self.start + len(self.shuffle)


@dataclass(frozen=True)
class EpochOrder:
    """`rows[p]`: the block row visited at position p of the epoch; `windows`: with `chunks`, the
    consecutive position ranges a reader fills one at a time (None with `global`). With `chunks`, `rows`
    is built on demand from the windows: a reader needs only the windows (4 bytes a row, not 8 + 8)."""

    block_size: int
    permutation: np.ndarray | None = None
    windows: list[Window] | None = None
    chunk_rows: int = 0

    @property
    def rows(self) -> np.ndarray:
        if self.permutation is not None:
            return self.permutation
        assert self.windows is not None
        parts = [chunk_rows_of(w.chunks, self.chunk_rows, self.block_size)[w.shuffle] for w in self.windows]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def global_order(block_size: int, seed: int, rank: int, epoch: int) -> EpochOrder:
    """`global`: `np.random.default_rng([seed, rank, epoch]).permutation(block_size)`."""
    return EpochOrder(block_size, epoch_permutation(block_size, seed, rank, epoch))


def chunk_rows_of(chunks: np.ndarray, chunk_rows: int, block_size: int) -> np.ndarray:
    """The block rows of `chunks`, chunk after chunk, each chunk's rows in block order."""
    parts = [np.arange(c * chunk_rows, min((c + 1) * chunk_rows, block_size)) for c in chunks.tolist()]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def chunk_order(block_size: int, seed: int, rank: int, epoch: int, layout: ChunkLayout) -> EpochOrder:
    """`chunks`, the sequential-read order. With rng = np.random.default_rng([seed, rank, epoch]):

    1. the block's rows are cut into C = ceil(n / chunk_rows) chunks of consecutive rows (chunk c holds
       rows [c x chunk_rows, min((c + 1) x chunk_rows, n)));
    2. the chunks are permuted: P = rng.permutation(C);
    3. P is cut into windows of window_chunks consecutive entries (the last may hold fewer);
    4. window after window, its rows are listed chunk after chunk (in P's order, each chunk's rows in
       block order), then shuffled: with R those rows, the window visits R[rng.permutation(len(R))]
       (the same rng, one draw per window, in window order);
    5. the epoch's order is the windows' orders one after another.

    A step then takes its slice of this order exactly as with `global` (`block_data.batch_slices`)."""
    rng = np.random.default_rng([seed, rank, epoch])
    num_chunks = -(-block_size // layout.chunk_rows)
    permuted = rng.permutation(num_chunks)
    windows, start = [], 0
    for lo in range(0, num_chunks, layout.window_chunks):
        chunks = permuted[lo:lo + layout.window_chunks]
        size = sum(min((c + 1) * layout.chunk_rows, block_size) - c * layout.chunk_rows for c in chunks.tolist())
        # Held for the whole epoch, a window's shuffle as int32 (the same values): 4 bytes a block row.
        windows.append(Window(start, chunks, rng.permutation(size).astype(np.int32 if size < 2**31 else np.int64)))
        start += size
    return EpochOrder(block_size, None, windows, layout.chunk_rows)


def epoch_order(block_size: int, seed: int, rank: int, epoch: int, layout: ChunkLayout | None) -> EpochOrder:
    """The epoch's order: `chunk_order` with a layout (epoch_order=chunks), else `global_order`."""
    if layout is None:
        return global_order(block_size, seed, rank, epoch)
    return chunk_order(block_size, seed, rank, epoch, layout)
