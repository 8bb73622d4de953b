"""How a step gets its rows in an epoch's order: `OrderFeed` indexes the block directly (memory blocks,
and the global order on disk); `WindowFeed` reads an epoch's windows (epoch_order=chunks) sequentially,
a window ahead, on a reader thread, so reading and training overlap within the memory budget.

`open_feed` picks one; a feed serves a run's epochs from a first position on (a resumed run's), with
`next_epoch()` between them, and is then closed. The window reader reads on across an epoch's end: the
next epoch's first window is read while the last one trains, so no epoch starts by waiting for it.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from blocksync.engine.worker.block_store import DiskBlock
from blocksync.engine.worker.stream_block import StreamBlock

if TYPE_CHECKING:
    from blocksync.engine.worker.block_store import Block
    from blocksync.engine.worker.epoch_order import EpochOrder, Window

Piece = tuple[np.ndarray, np.ndarray, np.ndarray]
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Feed(Protocol):
    read_seconds: float
    """Seconds the reader spent reading windows (0 without one)."""
    new_window: bool
    """Whether the last `take` brought in a window (False without a reader)."""

    def take(self, lo: int, hi: int) -> Batch: ...

    def next_epoch(self) -> None: ...

    def close(self) -> None: ...


class RowSource(Protocol):
    """A block that copies consecutive rows out: `empty(rows)` arrays and `read_into(lo, hi, out)`."""

    def empty(self, rows: int) -> Piece: ...

    def read_into(self, lo: int, hi: int, out: Piece, at: int) -> None: ...


class OrderFeed:
    """Positions [lo, hi) of the epoch's order, taken from the block row by row (`Block.take`)."""

    read_seconds = 0.0
    new_window = False

    def __init__(self, block: Block, order: EpochOrder, device: torch.device,
                 later: Iterable[EpochOrder] = ()) -> None:
        self.block, self.device, self._later = block, device, iter(later)
        self.rows = torch.from_numpy(order.rows).to(device)

    def take(self, lo: int, hi: int) -> Batch:
        return self.block.take(self.rows[lo:hi])

    def next_epoch(self) -> None:
        self.rows = torch.from_numpy(next(self._later).rows).to(self.device)

    def close(self) -> None:
        pass


class WindowFeed:
    """Positions [lo, hi) of a `chunks` epoch, from windows read in order by a thread.

    At most `slots` windows are held at once (read, queued or in use): two, so the next window is read
    while the current one trains; a step's rows come from the one or two windows its slice covers (a
    window holds at least one local batch: the driver checks). `later`: the orders of the epochs after
    this one, whose windows the thread reads on in the same slots (their orders computed there, as it
    reaches them). Time a step waits for its window is part of its `data` phase; the thread's reading
    time is `read_seconds`."""

    def __init__(self, source: RowSource, order: EpochOrder, first_position: int, device: torch.device,
                 slots: int = 2, later: Iterable[EpochOrder] = ()) -> None:
        assert order.windows is not None
        self.source, self.device, self.chunk_rows = source, device, order.chunk_rows
        self.block_size = order.block_size
        self.read_seconds = 0.0
        self.new_window = False
        self._epoch = 0  # the epoch `take` serves, counted from this feed's first
        self._pending = self._windows(order, first_position, later)
        self._held: list[tuple[Window, Piece]] = []  # windows of later epochs: positions + k x block_size
        self._slots, self._num_slots = threading.Semaphore(slots), slots
        self._ready: queue.Queue[tuple[Window, Piece] | BaseException] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="blocksync-window-reader", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            for window in self._pending:
                while not self._slots.acquire(timeout=0.05):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                started = time.perf_counter()
                piece = self._read(window)
                self.read_seconds += time.perf_counter() - started
                self._ready.put((window, piece))
        except BaseException as err:  # handed to the training thread, which raises it
            self._ready.put(err)

    def _windows(self, order: EpochOrder, first_position: int, later: Iterable[EpochOrder]) -> Iterator[Window]:
        """This epoch's windows from `first_position` on, then every later epoch's, the k-th epoch after this
        one's positions moved by k x block_size, so that positions only grow."""
        assert order.windows is not None
        yield from (w for w in order.windows if w.stop > first_position)
        for k, following in enumerate(later, start=1):
            assert following.windows is not None and following.block_size == self.block_size
            yield from (dataclasses.replace(w, start=w.start + k * self.block_size) for w in following.windows)

    def _ranges(self, window: Window) -> list[tuple[int, int]]:
        """The block rows [lo, hi) of the window's chunks, in the window's order."""
        return [(c * self.chunk_rows, min((c + 1) * self.chunk_rows, self.block_size)) for c in window.chunks.tolist()]

    def _read(self, window: Window) -> Piece:
        """The window's rows, chunk after chunk in the window's order: each chunk one sequential read of
        its rows, the chunks read in block order (a file's bytes, a Parquet file's row groups, in order)."""
        ranges = self._ranges(window)
        offsets = np.concatenate([[0], np.cumsum([hi - lo for lo, hi in ranges])]).astype(np.int64)
        out = self.source.empty(len(window.shuffle))
        for i in np.argsort(window.chunks, kind="stable").tolist():
            lo, hi = ranges[i]
            self.source.read_into(lo, hi, out, int(offsets[i]))
        return out

    def take(self, lo: int, hi: int) -> Batch:
        """The rows at positions [lo, hi) of the current epoch."""
        lo, hi = lo + self._epoch * self.block_size, hi + self._epoch * self.block_size
        while self._held and self._held[0][0].stop <= lo:  # positions only grow: that window is done
            self._held.pop(0)
            self._slots.release()
        self.new_window = False
        while hi > lo and (not self._held or self._held[-1][0].stop < hi):
            self.new_window = True
            assert len(self._held) < self._num_slots, "a window must hold a local batch (the driver checks)"
            item = self._ready.get()
            if isinstance(item, BaseException):
                raise item
            self._held.append(item)
        x, ids, y = self.source.empty(hi - lo)
        for window, (wx, wids, wy) in self._held:
            a, b = max(lo, window.start), min(hi, window.stop)
            if a < b:
                local = window.shuffle[a - window.start:b - window.start]
                x[a - lo:b - lo], ids[a - lo:b - lo], y[a - lo:b - lo] = wx[local], wids[local], wy[local]
        return (torch.from_numpy(x).to(self.device), torch.from_numpy(ids).to(self.device),
                torch.from_numpy(y).to(self.device))

    def next_epoch(self) -> None:
        self._epoch += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._held.clear()


def open_feed(block: Block, order: EpochOrder, first_position: int, device: torch.device,
              later: Iterable[EpochOrder] = ()) -> Feed:
    """A window reader for a `chunks` order over a block that reads rows from storage; else the order
    indexes the block directly. `later`: the next epochs' orders, for `next_epoch()`."""
    if order.windows is not None and isinstance(block, (DiskBlock, StreamBlock)):
        return WindowFeed(block, order, first_position, device, later=later)
    return OrderFeed(block, order, device, later)
