"""Reading a disk block's chunks around the page cache (O_DIRECT), for `epoch_order=chunks`.

Each chunk is read once an epoch into a window. Through the page cache every page is copied twice and,
under a container's memory limit, makes the kernel reclaim another page of the same cgroup: CPU the
reader takes from the training thread on the same cores (`benchmarks/results/memory_limit.md`).

O_DIRECT needs offset, length and memory address aligned (ALIGN, 4096 bytes). `DirectReads.read` reads
a range's aligned middle straight into its destination when both are aligned alike (windows are
page-aligned, `aligned_empty`) and the rest through a small page-aligned bounce buffer: the same bytes
a buffered read gives (`tests/test_direct_io.py`). Where a filesystem refuses O_DIRECT (tmpfs before
Linux 6.6, some FUSE mounts) `DirectReads.open` returns None and the block is read through the page
cache, which the worker logs and `metrics.json` shows (`direct_reads`).
"""

from __future__ import annotations

import logging
import math
import mmap
import os
from typing import IO

import numpy as np

log = logging.getLogger(__name__)

ALIGN = 4096
BOUNCE_BYTES = 256 * 1024
"""The bounce buffer for unaligned edges and ranges: small enough to stay in a core's cache while its
bytes are copied out."""


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized array whose data starts on an ALIGN boundary (numpy's allocator gives 16 or 64)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


class DirectReads:
    """O_DIRECT descriptors of a block's files (opened again through /proc/self/fd, as the files have no
    name) and one bounce buffer; used by one thread (the window reader)."""

    def __init__(self, fds: dict[int, int]) -> None:
        self._fds = fds  # the block file's descriptor -> its O_DIRECT descriptor
        self._bounce = mmap.mmap(-1, BOUNCE_BYTES)  # anonymous mappings start on a page
        self._view = memoryview(self._bounce)

    @classmethod
    def open(cls, files: list[IO[bytes]], what: str = "block_storage=disk: the local directory's filesystem",
             ) -> DirectReads | None:
        """Direct reads of `files`, or None (logged, naming `what`) where their filesystem refuses O_DIRECT."""
        fds: dict[int, int] = {}
        probe = mmap.mmap(-1, ALIGN)
        try:
            for f in files:
                fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
                fds[f.fileno()] = fd
                os.preadv(fd, [probe], 0)  # some filesystems accept the flag at open and refuse the read
        except OSError as err:
            for fd in fds.values():
                os.close(fd)
            log.warning("%s refuses O_DIRECT reads (%s); the chunk order's windows are read through the page "
                        "cache, which costs the reader more CPU", what, err)
            return None
        finally:
            probe.close()
        return cls(fds)

    def read(self, fileno: int, out: memoryview, offset: int) -> None:
        """out[:] = the file's bytes [offset, offset + len(out))."""
        fd = self._fds[fileno]
        n = len(out)
        address = np.frombuffer(out, np.uint8).ctypes.data if n else 0
        first = -(-offset // ALIGN) * ALIGN  # the middle [first, last) is read straight into `out`
        last = (offset + n) // ALIGN * ALIGN
        if (address - offset) % ALIGN or last <= first:
            self._bounced(fd, out, offset)
            return
        self._bounced(fd, out[:first - offset], offset)
        done = first
        while done < last:
            got = os.preadv(fd, [out[done - offset:last - offset]], done)
            if got <= 0:
                raise OSError(f"the block's file ended early at offset {done}")
            done += got
        self._bounced(fd, out[last - offset:], last)

    def _bounced(self, fd: int, out: memoryview, offset: int) -> None:
        """out[:] = the bytes at `offset`, read in aligned spans through the bounce buffer."""
        done = 0
        while done < len(out):
            position = offset + done
            start = position - position % ALIGN
            span = min(BOUNCE_BYTES, -(-(offset + len(out) - start) // ALIGN) * ALIGN)
            got = os.preadv(fd, [self._view[:span]], start)
            useful = min(got - (position - start), len(out) - done)
            if useful <= 0:
                raise OSError(f"the block's file ended early at offset {position}")
            out[done:done + useful] = self._view[position - start:position - start + useful]
            done += useful

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._view.release()
        self._bounce.close()
