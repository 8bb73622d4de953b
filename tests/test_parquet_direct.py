"""Row groups of a local Parquet file read around the page cache (engine.worker.parquet_direct): the same
tables as pyarrow's own reader for every row group and column subset, none of the file's pages left in the
page cache, and pyarrow's reader where the filesystem is not the local one."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from blocksync.engine.worker.parquet_direct import DirectRowGroups, SpanFile
from tests.test_direct_io import cached_bytes


def table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 6), dtype=np.float32)
    return pa.table({"features": pa.array(list(x), pa.list_(pa.float32())), "label": rng.integers(0, 3, rows),
                     "weight": rng.random(rows)})


@pytest.mark.parametrize("writer", [{}, {"compression": "none", "use_dictionary": False},
                                    {"compression": "zstd", "data_page_size": 512}])
def test_row_groups_read_directly_equal_pyarrows_and_leave_no_page_cached(tmp_path, writer):
    path = str(tmp_path / "data.parquet")
    pq.write_table(table(1000, 3), path, row_group_size=97, **writer)  # unaligned row groups; small pages
    groups = [*range(pq.ParquetFile(path).num_row_groups), 4, 0]  # in order, then back
    subsets = (["features", "label"], ["label"], ["features", "label", "weight"])
    expected = {(g, tuple(c)): pq.ParquetFile(path).read_row_group(g, columns=c) for g in groups for c in subsets}
    reader = DirectRowGroups.open(pafs.LocalFileSystem(), path)
    assert reader is not None  # this machine's disk (ext4) takes O_DIRECT
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # dirty pages cannot be dropped
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # the file's pages: written, and read above
        kept = []
        try:
            for group in groups:
                for columns in subsets:
                    got = reader.read_row_group(group, columns)
                    assert got.equals(expected[group, tuple(columns)]), (group, columns)
                    kept.append((got, group, columns))
            # Tables read earlier still hold their rows: nothing decoded aliases the reused buffer.
            for got, group, columns in kept:
                assert got.equals(expected[group, tuple(columns)]), (group, columns)
            assert cached_bytes(f) == 0
        finally:
            reader.close()


def test_columns_with_dots_in_their_names_are_read_from_their_own_chunks(tmp_path):
    path = str(tmp_path / "data.parquet")
    data = table(300, 5).rename_columns(["x.features", "y", "w.eight"])
    pq.write_table(data, path, row_group_size=64)
    reader = DirectRowGroups.open(pafs.LocalFileSystem(), path)
    assert reader is not None
    try:
        for group in range(5):
            for columns in (["x.features", "y"], ["w.eight"], ["x.features"]):
                lo, hi = reader._span_of(group, columns)
                got = reader.read_row_group(group, columns)
                assert got.equals(pq.ParquetFile(path).read_row_group(group, columns=columns)), (group, columns)
                chunks = [reader.metadata.row_group(group).column(i) for i in range(3)]
                wanted = [c for c in chunks if c.path_in_schema.split(".list.")[0] in columns]
                assert lo == min(c.data_page_offset if c.dictionary_page_offset is None else c.dictionary_page_offset
                                 for c in wanted)
    finally:
        reader.close()


def test_files_not_on_the_local_filesystem_are_left_to_pyarrow(tmp_path):
    path = str(tmp_path / "data.parquet")
    pq.write_table(table(10, 4), path)
    remote_like = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())  # as HDFS or S3: not LocalFileSystem
    assert DirectRowGroups.open(remote_like, path) is None


def test_a_span_file_serves_its_range_from_memory_and_the_rest_from_the_file(tmp_path):
    path = tmp_path / "bytes"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    span = SpanFile(str(path), len(data))
    span.load(4096, memoryview(bytearray(data[4096:8192])))
    span.seek(5000)
    assert isinstance(inside := span.read(100), memoryview) and bytes(inside) == data[5000:5100]
    assert span.tell() == 5100
    span.seek(-50, 2)  # from the end, outside the range
    assert span.read() == data[-50:] and span.tell() == len(data)
    span.seek(4000)  # straddles the range's start
    assert bytes(span.read(200)) == data[4000:4200]
