"""train.epoch_order=chunks: the sequential-read order, its window reader, and the driver's checks (no Spark)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from blocksync import TrainConfig
from blocksync.engine.driver.storage import resolve_chunks, resolve_order, resolve_storage
from blocksync.engine.plan import ChunkLayout
from blocksync.engine.worker.block_store import DiskBlockWriter, MemoryBlock, row_bytes
from blocksync.engine.worker.epoch_order import chunk_layout, chunk_order, epoch_order, global_order
from blocksync.engine.worker.window_reader import OrderFeed, WindowFeed, open_feed
from tests import reference

CPU = torch.device("cpu")


def test_the_layout_follows_the_documented_rule():
    # 40-byte rows (8 features, a label): 4 MiB chunks of 104,857 rows; a 256 MiB budget less one batch of
    # 1,000 rows, halved: 134,197,728 bytes, 31 whole chunks.
    assert chunk_layout(40, 4.0, 256, None, 1000) == ChunkLayout(104_857, 31)
    assert chunk_layout(40, 4.0, 256, 8.5, 1000) == ChunkLayout(104_857, 2)  # 8.5 MiB: two whole chunks
    assert chunk_layout(40, 0.0001, 1, 0.0001, 1) == ChunkLayout(2, 1)  # at least one row, one chunk


@pytest.mark.parametrize(("rows", "layout"), [(1000, ChunkLayout(64, 3)), (7, ChunkLayout(3, 1)),
                                              (5, ChunkLayout(100, 4)), (0, ChunkLayout(4, 2))])
def test_the_chunk_order_is_the_documented_one_and_covers_the_block_once(rows, layout):
    order = chunk_order(rows, seed=3, rank=1, epoch=2, layout=layout)
    np.testing.assert_array_equal(np.sort(order.rows), np.arange(rows))
    expected = reference.visit_order(rows, 3, 1, 2, (layout.chunk_rows, layout.window_chunks))
    np.testing.assert_array_equal(order.rows, expected)  # tests/reference.py, written from the rule alone
    assert order.windows is not None
    for window in order.windows:
        # A window is a run of consecutive positions holding exactly its chunks' rows.
        seen = np.sort(order.rows[window.start:window.stop])
        chunks = [np.arange(c * layout.chunk_rows, min((c + 1) * layout.chunk_rows, rows)) for c in window.chunks]
        np.testing.assert_array_equal(seen, np.sort(np.concatenate(chunks)))
        assert len(window.chunks) <= layout.window_chunks


def test_orders_are_seeded_by_seed_rank_and_epoch():
    layout = ChunkLayout(10, 2)
    first = chunk_order(500, 1, 0, 0, layout).rows
    np.testing.assert_array_equal(first, chunk_order(500, 1, 0, 0, layout).rows)
    for other in (chunk_order(500, 2, 0, 0, layout), chunk_order(500, 1, 1, 0, layout),
                  chunk_order(500, 1, 0, 1, layout)):
        assert not np.array_equal(first, other.rows)
    np.testing.assert_array_equal(global_order(500, 1, 0, 0).rows, np.random.default_rng([1, 0, 0]).permutation(500))
    assert epoch_order(500, 1, 0, 0, None).windows is None


def disk_and_memory(tmp_path, rows: int = 1000, features: int = 5, weighted: bool = False, ids: int = 0):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    y = np.stack([rng.integers(0, 3, rows), rng.random(rows)], 1) if weighted else rng.integers(0, 3, rows) * 1.0
    idx = rng.integers(0, 2**40, size=(rows, ids))
    writer = DiskBlockWriter(features, rows, str(tmp_path), target_columns=2 if weighted else 1, id_width=ids)
    for lo in range(0, rows, 97):
        writer.append(x[lo:lo + 97], y[lo:lo + 97], idx[lo:lo + 97])
    return writer.finish(2**20, CPU), MemoryBlock(x, y, CPU, idx)


@pytest.mark.parametrize(("weighted", "ids", "first_step"), [(False, 0, 0), (True, 2, 0), (False, 0, 13)])
def test_the_window_reader_gives_the_rows_a_memory_block_gives(tmp_path, weighted, ids, first_step):
    """Local batches of 33 or 34 rows straddle windows of 3 chunks of 16 rows; a resumed epoch starts
    mid-window."""
    disk, memory = disk_and_memory(tmp_path, weighted=weighted, ids=ids)
    order = chunk_order(1000, 5, 2, 1, ChunkLayout(16, 3))
    edges = [(s * 1000) // 30 for s in range(31)]
    feed = open_feed(disk, order, edges[first_step], CPU)
    assert isinstance(feed, WindowFeed)
    try:
        for lo, hi in zip(edges[first_step:-1], edges[first_step + 1:], strict=True):
            for a, b in zip(feed.take(lo, hi), memory.take(torch.from_numpy(order.rows[lo:hi])), strict=True):
                assert torch.equal(a, b)
    finally:
        feed.close()
        disk.close()
    assert isinstance(open_feed(memory, order, 0, CPU), OrderFeed)  # a memory block indexes itself


class CountingSource:
    """A row source over arrays that records each read and how many windows are held at once."""

    def __init__(self, x: np.ndarray, fail_at: int | None = None) -> None:
        self.x, self.reads, self.fail_at = x, [], fail_at
        self.live = self.peak = 0
        self.lock = threading.Lock()

    def empty(self, rows: int):
        with self.lock:
            if rows > 40:  # a window, not a batch
                self.live += 1
                self.peak = max(self.peak, self.live)
        return np.empty((rows, 1), np.float32), np.empty((rows, 0), np.int64), np.empty(rows, np.float64)

    def read_into(self, lo: int, hi: int, out, at: int) -> None:
        if self.fail_at is not None and lo >= self.fail_at:
            raise OSError(f"rows {lo}..{hi} could not be read")
        self.reads.append((lo, hi))
        out[0][at:at + hi - lo] = self.x[lo:hi]
        out[2][at:at + hi - lo] = 0.0


def test_the_reader_reads_whole_chunks_once_and_holds_two_windows(monkeypatch):
    source = CountingSource(np.arange(1000, dtype=np.float32)[:, None])
    order = chunk_order(1000, 0, 0, 0, ChunkLayout(25, 2))  # 50-row windows, 10-row batches
    feed = WindowFeed(source, order, 0, CPU)
    released = 0
    original = feed._slots.release

    def count_release() -> None:
        nonlocal released
        released += 1
        source.live -= 1
        original()

    monkeypatch.setattr(feed._slots, "release", count_release)
    try:
        for lo in range(0, 1000, 10):
            x, _, _ = feed.take(lo, lo + 10)
            np.testing.assert_array_equal(x[:, 0].numpy(), order.rows[lo:lo + 10])
    finally:
        feed.close()
    assert sorted(source.reads) == [(lo, lo + 25) for lo in range(0, 1000, 25)]  # each chunk once, whole
    assert source.peak == 2 and released == 19  # never more than the window in use and the next one


def test_the_reader_reads_on_into_the_next_epoch_within_two_windows(monkeypatch):
    """One feed for three epochs: each epoch's rows are its own order's, the next epoch's first window is read
    while the last one trains, and at most two windows are held at any time, across the boundary too."""
    source = CountingSource(np.arange(1000, dtype=np.float32)[:, None])
    orders = [chunk_order(1000, 0, 0, epoch, ChunkLayout(25, 2)) for epoch in range(3)]
    feed = WindowFeed(source, orders[0], 0, CPU, later=iter(orders[1:]))
    original = feed._slots.release

    def count_release() -> None:
        source.live -= 1
        original()

    monkeypatch.setattr(feed._slots, "release", count_release)
    try:
        for epoch, order in enumerate(orders):
            if epoch:
                feed.next_epoch()
            for lo in range(0, 1000, 10):
                x, _, _ = feed.take(lo, lo + 10)
                np.testing.assert_array_equal(x[:, 0].numpy(), order.rows[lo:lo + 10])
            if epoch < 2:  # the last window trains: the next epoch's first is read meanwhile
                deadline = time.monotonic() + 10
                while len(source.reads) < 40 * (epoch + 1) + 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert len(source.reads) == 40 * (epoch + 1) + 2, "the next epoch's first window was not read ahead"
    finally:
        feed.close()
    assert len(source.reads) == 3 * 40 and source.peak == 2


def test_a_read_error_reaches_the_step():
    source = CountingSource(np.zeros((400, 1), np.float32), fail_at=0)
    feed = WindowFeed(source, chunk_order(400, 0, 0, 0, ChunkLayout(50, 2)), 0, CPU)
    try:
        with pytest.raises(OSError, match=r"rows \d+\.\.\d+ could not be read"):
            feed.take(0, 10)
    finally:
        feed.close()


def test_the_driver_refuses_a_budget_too_small_for_two_windows_and_a_batch():
    assert row_bytes(16) == 72
    cfg = TrainConfig(num_workers=2, block_storage="disk", epoch_order="chunks", memory_budget_mb=1, chunk_mb=0.25)
    # 100 steps of blocks of 100,000 rows: local batches of 1,000 rows (72,000 bytes); chunks of 3,640 rows;
    # (1 MiB - 72,000) // 2 = 488,288 bytes make one chunk of 262,080 a window.
    assert resolve_chunks(cfg, [100_000, 100_000], 16, 100, "disk") == ChunkLayout(3640, 1)
    # 10 steps: batches of 10,000 rows need a window of 3 chunks: 2 x 10,920 + 10,000 rows = 2.3 MiB.
    with pytest.raises(ValueError, match=r"train.memory_budget_mb=1 cannot hold two shuffle windows \(the one "
                                         r"trained on and the next, read meanwhile\) and one local batch of 10000 "
                                         r"rows with epoch_order=chunks and block_storage=disk; it needs at least 3\."):
        resolve_chunks(cfg, [100_000, 100_000], 16, 10, "disk")
    assert resolve_chunks(TrainConfig(**{**cfg.to_dict(), "memory_budget_mb": 3}), [100_000] * 2, 16, 10, "disk")
    assert resolve_chunks(cfg, [100_000, 100_000], 16, 10, "memory") is not None  # memory: the order only
    # stream also holds a row group being decoded, 3 x its bytes: (1 MiB - 72,000 - 300,000) // 2 still makes one chunk
    # a window; with row groups of 200,000 bytes, 2 x 262,080 + 72,000 + 600,000 bytes are over 1 MiB.
    assert resolve_chunks(cfg, [100_000, 100_000], 16, 100, "stream", 100_000) == ChunkLayout(3640, 1)
    with pytest.raises(ValueError, match=r"one local batch of 1000 rows, and decoding a row group of the files "
                                         r"\(0\.573 MiB\), with epoch_order=chunks and block_storage=stream; it needs "
                                         r"at least 2\."):
        resolve_chunks(cfg, [100_000, 100_000], 16, 100, "stream", 200_000)
    small = TrainConfig(**{**cfg.to_dict(), "shuffle_window_mb": 0.5})
    # 100,000 rows make 27 chunks and one of 1,720 rows: a window of 3 chunks may hold 2 x 3,640 + 1,720 = 9,000.
    with pytest.raises(ValueError, match=r"train.shuffle_window_mb=0.5 holds 7280 rows, fewer than one local batch "
                                         r"of 10000 rows \(with a block's short last chunk\); raise it to at least "
                                         r"1, or leave it unset\."):
        resolve_chunks(small, [100_000, 100_000], 16, 10, "disk")
    assert resolve_chunks(TrainConfig(num_workers=2), [10], 16, 1, "disk") is None  # the global order
    # The global order's one-batch check does not stand in the way of the chunks check.
    assert resolve_storage(cfg, [100_000, 100_000], 16, 10, None) == "disk"


def test_the_settings_are_checked():
    with pytest.raises(ValueError, match=r"epoch_order='rows' is not one of global, chunks"):
        TrainConfig(epoch_order="rows")
    with pytest.raises(ValueError, match=r"chunk_mb=0 must be > 0"):
        TrainConfig(chunk_mb=0)
    with pytest.raises(ValueError, match=r"shuffle_window_mb=-1 must be > 0"):
        TrainConfig(shuffle_window_mb=-1)


def test_epoch_order_auto_reads_in_chunks_the_blocks_read_from_storage_that_exceed_the_budget():
    cfg = TrainConfig(num_workers=2, epoch_order="auto", memory_budget_mb=1, chunk_mb=0.25)
    big, small = [100_000] * 2, [1_000] * 2  # 72 bytes a row: 7.2 MB and 72 kB blocks against a 1 MiB budget
    assert [resolve_order(cfg, big, 16, s) for s in ("disk", "stream", "memory")] == ["chunks", "chunks", "global"]
    assert [resolve_order(cfg, small, 16, s) for s in ("disk", "stream", "memory")] == ["global", "chunks", "global"]
    assert resolve_order(TrainConfig(num_workers=2, epoch_order="global"), big, 16, "disk") == "global"
    assert resolve_chunks(cfg, big, 16, 100, "disk") == ChunkLayout(3640, 1)
    assert resolve_chunks(cfg, big, 16, 100, "memory") is None and resolve_chunks(cfg, small, 16, 10, "disk") is None
    TrainConfig(block_storage="stream", epoch_order="auto")  # stream with auto reads in chunks: allowed
