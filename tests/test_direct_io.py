"""Reading around the page cache (engine.worker.direct_io): the same bytes as a buffered read for every
alignment of offset, length and destination, no page of the file left in the page cache, and the page
cache path where a filesystem refuses O_DIRECT."""

from __future__ import annotations

import logging
import os
import subprocess

import numpy as np
import pytest

from blocksync.engine.worker import direct_io
from blocksync.engine.worker.direct_io import ALIGN, BOUNCE_BYTES, DirectReads, aligned_empty

SIZE = 3 * BOUNCE_BYTES + 5 * ALIGN + 123  # not a multiple of ALIGN: reads at the end come back short


@pytest.fixture()
def block_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path / "block"
    path.write_bytes(data)
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # dirty pages cannot be dropped
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        yield f, data


def test_direct_reads_return_the_files_bytes_at_every_alignment(block_file):
    f, data = block_file
    reads = DirectReads.open([f])
    assert reads is not None  # this machine's disk (ext4) takes O_DIRECT
    cases = [(0, SIZE), (0, ALIGN), (ALIGN, 2 * BOUNCE_BYTES), (7, 100), (ALIGN - 1, 2), (SIZE - 123, 123),
             (SIZE - 5000, 5000), (3 * ALIGN + 40, BOUNCE_BYTES + 9000), (SIZE - 1, 1)]
    rng = np.random.default_rng(1)
    cases += [(int(o), int(rng.integers(1, SIZE - o + 1))) for o in rng.integers(0, SIZE - 1, 40)]
    try:
        for offset, length in cases:
            for shift in (0, 40, offset % ALIGN):  # the destination aligned, off by 40, aligned like the offset
                out = aligned_empty((length + shift,), np.uint8)[shift:]
                reads.read(f.fileno(), memoryview(out), offset)
                assert out.tobytes() == data[offset:offset + length], (offset, length, shift)
        with pytest.raises(OSError, match="ended early"):
            reads.read(f.fileno(), memoryview(np.empty(10, np.uint8)), SIZE - 5)
    finally:
        reads.close()


def test_direct_reads_leave_nothing_in_the_page_cache(block_file):
    f, data = block_file
    reads = DirectReads.open([f])
    assert reads is not None
    out = aligned_empty((SIZE,), np.uint8)
    reads.read(f.fileno(), memoryview(out), 0)
    reads.close()
    assert out.tobytes() == data
    assert cached_bytes(f) == 0
    os.pread(f.fileno(), 4 * ALIGN, 0)  # a buffered read does cache its pages: the check above can fail
    assert cached_bytes(f) >= 4 * ALIGN


def cached_bytes(f) -> int:
    """How much of the open file the page cache holds (util-linux's fincore, mincore(2) underneath)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", f"/proc/self/fd/{f.fileno()}"],
                         capture_output=True, text=True, check=True, pass_fds=(f.fileno(),)).stdout
    return int(out.split()[0])


def test_a_filesystem_refusing_o_direct_is_read_through_the_page_cache_and_says_so(block_file, monkeypatch, caplog):
    f, _ = block_file
    real_open = os.open

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")  # what tmpfs before Linux 6.6 answers
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", refusing)
    with caplog.at_level(logging.WARNING, logger=direct_io.__name__):
        assert DirectReads.open([f]) is None
    assert "refuses O_DIRECT" in caplog.text and "page cache" in caplog.text


def test_aligned_arrays_start_on_a_page():
    for rows in (1, 7, 4096):
        for dtype in (np.float32, np.int64, np.float64):
            array = aligned_empty((rows, 3), dtype)
            assert array.ctypes.data % ALIGN == 0 and array.shape == (rows, 3) and array.dtype == dtype
