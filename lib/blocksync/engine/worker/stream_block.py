"""block_storage=stream: a rank's block stays in its Parquet files (local, HDFS, S3 ... through pyarrow)
and every epoch reads it again, window by window in the chunk order (`window_reader.WindowFeed`), with
no copy on the executor's memory or disk. For data larger than the executors' local disks. Files on the
executor's local filesystem are read around the page cache (`parquet_direct`), the rest through pyarrow's
filesystem; `direct_reads` (in metrics.json) says which.

Each file is checked against the size and modification time the driver read with its footers, before
the first read and before every row group read: a file that changed or disappeared stops the run,
naming it. Rows are checked as they are read (the other modes check them while loading).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from blocksync.engine.plan import ShardPlan
from blocksync.engine.worker.parquet_direct import DirectRowGroups
from blocksync.engine.worker.shard_reader import piece_arrays

Check = Callable[[np.ndarray, np.ndarray, np.ndarray], str]
"""(features, ids, targets) -> what is wrong with these rows, or ""."""


class FileChanged(ValueError):
    """A Parquet file of a streamed block changed or disappeared after the driver planned the run."""


class StreamBlock:
    """The rows of `rank`'s pieces, read on demand: `read_into` copies consecutive block rows out."""

    def __init__(self, plan: ShardPlan, rank: int, num_features: int, check: Check) -> None:
        self.plan, self.num_features, self.check = plan, num_features, check
        self.pieces = plan.pieces[rank]
        self.starts = np.concatenate([[0], np.cumsum([p.stop - p.start for p in self.pieces])]).astype(np.int64)
        self.rows = int(self.starts[-1])
        self.target_shape = (2,) if plan.weight else ()
        self.columns = [*plan.features, plan.label, *([plan.weight] if plan.weight else [])]
        self._files: dict[str, pq.ParquetFile | DirectRowGroups] = {}
        self.direct_reads: bool | None = None  # whether local files are read around the page cache (None: unread)
        self._lock = threading.Lock()
        self._group: tuple[str, int, object] | None = None  # the last row group read: windows read in order
        for path in dict.fromkeys(p.path for p in self.pieces):
            self._check_file(path)

    def _check_file(self, path: str) -> None:
        expected = self.plan.file_facts.get(path)
        if expected is None:
            return
        info = self.plan.filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileChanged(f"the Parquet file {path} disappeared during training; block_storage=stream reads "
                              "the files every epoch: keep them in place until the run ends, or use "
                              "block_storage=disk.")
        mtime = info.mtime_ns
        if info.size != expected[0] or (expected[1] is not None and mtime is not None and mtime != expected[1]):
            raise FileChanged(f"the Parquet file {path} changed during training (size {expected[0]:,} -> "
                              f"{info.size:,} bytes, or a new modification time); block_storage=stream reads the "
                              "files every epoch: keep them unchanged until the run ends, or use block_storage=disk.")

    def _row_group(self, path: str, row_group: int):
        if self._group is not None and self._group[:2] == (path, row_group):
            return self._group[2]
        self._check_file(path)
        try:
            if path not in self._files:
                self._files[path] = self._open(path)
            # Decoded on the reader thread itself: with one feature column pyarrow's threads add hand-offs, not
            # speed (about 390 against 320 MB/s of rows on 2 cores), and each thread keeps freed memory of its own.
            table = self._files[path].read_row_group(row_group, columns=self.columns, use_threads=False)
        except OSError:
            self._check_file(path)  # a file gone or changed says so; otherwise the read error itself
            raise
        self._group = (path, row_group, table)
        return table

    def _open(self, path: str) -> pq.ParquetFile | DirectRowGroups:
        """A local file read around the page cache where its filesystem allows (`parquet_direct`), else
        pyarrow's reader on the plan's filesystem."""
        direct = DirectRowGroups.open(self.plan.filesystem, path)
        self.direct_reads = (self.direct_reads is not False) and direct is not None  # every file read directly
        return direct if direct is not None else pq.ParquetFile(self.plan.filesystem.open_input_file(path))

    def empty(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.empty((rows, self.num_features), np.float32), np.empty((rows, 0), np.int64),
                np.empty((rows, *self.target_shape), np.float64))

    def read_into(self, lo: int, hi: int, out: tuple[np.ndarray, ...], at: int) -> None:
        """out[k][at:at + hi - lo] = block rows [lo, hi), from the row groups they lie in. One call at a time:
        the window reader's thread and `weights` (the training thread, once an epoch) share the open files,
        the last row group read and a direct reader's buffer."""
        with self._lock:
            self._read_into(lo, hi, out, at)

    def _read_into(self, lo: int, hi: int, out: tuple[np.ndarray, ...], at: int) -> None:
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        for index in range(max(first, 0), len(self.pieces)):
            begin = int(self.starts[index])
            if begin >= hi:
                break
            piece = self.pieces[index]
            a, b = max(lo, begin), min(hi, int(self.starts[index + 1]))
            table = self._row_group(piece.path, piece.row_group)
            x, y = piece_arrays(self.plan, table.slice(piece.start + a - begin, b - a), self.num_features)
            problem = self.check(x, np.zeros((len(x), 0), np.int64), y)
            if problem:
                raise ValueError(f"{problem} (in {piece.path}, read by block_storage=stream)")
            out[0][at + a - lo:at + b - lo], out[2][at + a - lo:at + b - lo] = x, y

    def weights(self) -> torch.Tensor:
        """Every row's weight, read once an epoch (8 bytes a row in memory); rows of (label, weight) only."""
        y = np.empty((self.rows, *self.target_shape), np.float64)
        for lo in range(0, self.rows, 65536):
            part = self.empty(min(self.rows, lo + 65536) - lo)
            self.read_into(lo, lo + len(part[0]), part, 0)
            y[lo:lo + len(part[0])] = part[2]
        return torch.from_numpy(np.ascontiguousarray(y[:, 1]))

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise AssertionError("block_storage=stream reads windows in the chunk order (the driver checks)")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        self._group = None
        for reader in self._files.values():
            if isinstance(reader, DirectRowGroups):
                reader.close()
        self._files.clear()
