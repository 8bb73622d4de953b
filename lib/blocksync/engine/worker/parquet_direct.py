"""Reading a local Parquet file's row groups around the page cache (O_DIRECT), for block_storage=stream.

Through the page cache each page of the file is copied twice and, under a container's memory limit,
makes the kernel reclaim another page of the same cgroup: CPU the stream reader takes from the training
thread (`benchmarks/results/memory_limit.md`). Here the byte range that holds a row group's column chunks
is read in one O_DIRECT read (`direct_io.DirectReads`) into a page-aligned buffer, and pyarrow's own
Parquet reader decodes the row group from that buffer (`SpanFile` serves its reads), with the file's
footer, read once when the file is opened. Decoding is pyarrow's: only where the bytes come from changes.

`DirectRowGroups.open` returns None where this does not apply (a remote filesystem: HDFS, S3 ... read
through pyarrow as before) or where the filesystem refuses O_DIRECT (logged).
"""

from __future__ import annotations

import mmap
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from blocksync.engine.worker.direct_io import ALIGN, DirectReads


class SpanFile:
    """A read-only, seekable file object over one byte range of a file, held in memory (`load`): what
    pyarrow's Parquet reader reads a row group from. A read outside the range reads the file itself."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        self.position, self.base, self.span = 0, 0, memoryview(b"")

    def load(self, base: int, span: memoryview) -> None:
        self.base, self.span = base, span

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = offset if whence == 0 else self.position + offset if whence == 1 else self.size + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, n: int = -1) -> bytes | memoryview:
        n = self.size - self.position if n < 0 else min(n, self.size - self.position)
        at = self.position - self.base
        self.position += n
        if at >= 0 and at + n <= len(self.span):
            # No copy: the decoded table lives until the next `load`, and the stream reader drops it by then
            # (`StreamBlock._row_group` keeps the last row group's table only).
            return self.span[at:at + n]
        with open(self.path, "rb") as f:  # not met by `DirectRowGroups`, which passes the footer it read
            return os.pread(f.fileno(), n, self.position - n)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass


class DirectRowGroups:
    """One local Parquet file, read a row group at a time with one O_DIRECT read each."""

    def __init__(self, path: str, metadata: pq.FileMetaData, file, direct: DirectReads) -> None:
        self.metadata, self._file, self._direct = metadata, file, direct
        self._span = SpanFile(path, os.fstat(file.fileno()).st_size)
        self._parquet = pq.ParquetFile(self._span, metadata=metadata)
        self._buffer = mmap.mmap(-1, ALIGN)  # anonymous mappings start on a page; grown to the largest span

    @classmethod
    def open(cls, filesystem: pafs.FileSystem, path: str) -> DirectRowGroups | None:
        """Direct row-group reads of `path`, or None: not on the local filesystem, or O_DIRECT refused."""
        if not isinstance(filesystem, pafs.LocalFileSystem):
            return None
        file = open(path, "rb")  # noqa: SIM115 - closed by `close`
        try:
            metadata = pq.ParquetFile(file).metadata
            direct = DirectReads.open([file], "block_storage=stream: the Parquet files' filesystem")
        except BaseException:
            file.close()
            raise
        if direct is None:
            file.close()
            return None
        return cls(path, metadata, file, direct)

    def _span_of(self, group: int, columns: list[str]) -> tuple[int, int]:
        """The file's byte range [lo, hi) that holds the row group's chunks of `columns`."""
        row_group = self.metadata.row_group(group)
        chunks = [row_group.column(i) for i in range(row_group.num_columns)]
        # A column's chunks: its own path, or its leaves' (a list's `features.list.element`); names may hold dots.
        chunks = [c for c in chunks if any(c.path_in_schema == n or c.path_in_schema.startswith(n + ".")
                                           for n in columns)]
        starts = [min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in chunks]
        return min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks, strict=True))

    def read_row_group(self, group: int, columns: list[str], use_threads: bool = False) -> pa.Table:
        lo, hi = self._span_of(group, columns)
        base = lo - lo % ALIGN
        if len(self._buffer) < hi - base:  # the old buffer goes when the last table that may view it does
            self._buffer = mmap.mmap(-1, -(-(hi - base) // ALIGN) * ALIGN)
        view = memoryview(self._buffer)[:hi - base]
        self._direct.read(self._file.fileno(), view, base)
        self._span.load(base, view)
        return self._parquet.read_row_group(group, columns=columns, use_threads=use_threads)

    def close(self) -> None:
        self._span.load(0, memoryview(b""))
        self._direct.close()
        self._file.close()
