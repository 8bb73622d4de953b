"""Where a worker keeps its block: in memory, or on the executor's local disk (`train.block_storage`).

`memory`: the block is one float32 feature matrix, one int64 id matrix (typed inputs' token ids and
category codes; zero columns without them) and one float64 label vector,
filled in place as the input arrives (the driver knows the block's row count),
so loading holds at most one incoming batch beyond the block itself. On a GPU
the whole block is moved to the device once.

`disk`: unnamed files on the executor's local disk, read through bounded mappings (`DiskBlockWriter`,
`DiskBlock`, whose docstring has the details), or in the chunk order window by window, around the page
cache (`direct_io`). In `memory` mode a worker first checks its block against
its cgroup's memory limit (`check_block_fits`).
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

import numpy as np
import torch

from blocksync.engine.worker.direct_io import DirectReads, aligned_empty
from blocksync.engine.worker.stream_block import StreamBlock

PAGE = mmap.PAGESIZE
LABEL_BYTES = 8  # float64


def row_bytes(num_features: int) -> int:
    """Bytes of one row on disk (and in memory): float32 features and a float64 label. With typed inputs
    or row weights callers pass `storage_width`: an int64 id, or a float64 weight, takes the room of two
    float32 values."""
    return 4 * num_features + LABEL_BYTES


def storage_width(num_features: int, id_width: int, target_columns: int = 1) -> int:
    """The float32 width whose `row_bytes` are a row's bytes with `id_width` int64 ids beside the floats
    and `target_columns` float64 targets (2: a label and its weight)."""
    return num_features + 2 * id_width + 2 * (target_columns - 1)


def min_budget_bytes(local_batch_rows: int, num_features: int) -> int:
    """The smallest `memory_budget_mb` that holds one local batch as read from disk (the rows copied
    out, and one window of a few pages to read them through)."""
    return local_batch_rows * row_bytes(num_features) + 4 * PAGE + row_bytes(num_features)


def block_too_large(rows: int, num_features: int, limit: str | None = None) -> MemoryError:
    """What a worker says when its block does not fit: the block's size and the limit it hit (`limit`, or
    else this process's address-space limit)."""
    import resource

    if limit is None:
        cap, _ = resource.getrlimit(resource.RLIMIT_AS)
        limit = (f"this Python worker's address-space limit of {cap / 2**20:,.0f} MiB (spark.executor.pyspark.memory "
                 "per core)" if cap != resource.RLIM_INFINITY else "the memory left to this Python worker")
    return MemoryError(
        f"block_storage=memory: this block of {rows * row_bytes(num_features) / 2**20:,.0f} MiB ({rows} rows) "
        f"does not fit in {limit}; set train.block_storage=disk, or raise num_workers."
    )


def cgroup_memory(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> tuple[int, int] | None:
    """(limit, bytes in use that the kernel cannot reclaim) of this process's memory cgroup (v1 or v2),
    or None without a limit. YARN and Kubernetes enforce a container's memory this way: past the limit
    the kernel kills the process, with no Python error, so a worker checks before it fills its block."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    files: tuple[str, str, tuple[str, ...]]
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            files = (f"{root}/memory{path}", "memory.limit_in_bytes", ("total_rss", "rss"))
            break
        if controllers == "" and os.path.exists(f"{root}{path}/memory.max"):  # v2
            files = (f"{root}{path}", "memory.max", ("anon",))
            break
    else:
        return None
    folder, limit_file, anon_keys = files
    try:
        limit_text = Path(folder, limit_file).read_text().strip()
        stat = dict(ln.split() for ln in Path(folder, "memory.stat").read_text().splitlines() if ln.count(" ") == 1)
    except OSError:
        return None
    if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 2**60:  # v1: "no limit" is huge
        return None
    in_use = next((int(stat[k]) for k in anon_keys if stat.get(k, "").isdigit()), 0)
    return int(limit_text), in_use


def check_block_fits(rows: int, num_features: int) -> None:
    """A MemoryError naming the block and the cgroup limit when the block cannot fit beside what this
    process's cgroup already holds (page cache aside: the kernel reclaims it). A container's limit kills a
    process without a Python error, so in `memory` mode the worker refuses beforehand, naming both."""
    memory = cgroup_memory()
    if memory is not None and rows * row_bytes(num_features) > memory[0] - memory[1]:
        limit, in_use = memory
        raise block_too_large(rows, num_features, f"this worker's cgroup memory limit of {limit / 2**20:,.0f} MiB "
                                                  f"({in_use / 2**20:,.0f} MiB of it already in use)")


def spark_local_dir() -> str:
    """The first of the directories Spark gives its Python workers (SPARK_LOCAL_DIRS), else the temp dir."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return dirs[0] if dirs else tempfile.gettempdir()


class MemoryBlock:
    """The block as two tensors on the training device."""

    def __init__(self, x: np.ndarray, y: np.ndarray, device: torch.device, ids: np.ndarray | None = None) -> None:
        self.rows = int(x.shape[0])
        self.x = torch.from_numpy(x).to(device)  # x is a fresh array the worker owns
        self.y = torch.from_numpy(y).to(device)
        self.ids = torch.from_numpy(ids if ids is not None else np.zeros((self.rows, 0), np.int64)).to(device)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.x.index_select(0, idx), self.ids.index_select(0, idx), self.y.index_select(0, idx)

    def weights(self) -> torch.Tensor:
        """Every row's weight, on the CPU; rows of (label, weight) only."""
        return self.y[:, 1].cpu()

    def close(self) -> None:
        pass


class DiskBlockWriter:
    """Appends batches to the unnamed files (features, targets, ids); `finish()` maps them for training."""

    def __init__(self, num_features: int, expected_rows: int, directory: str | None = None,
                 target_columns: int = 1, id_width: int = 0, from_files: bool = False) -> None:
        """`from_files`: the rows come from Parquet files (blocks=files), which `stream` can read in place."""
        self.directory = directory or spark_local_dir()
        self.num_features, self.id_width = num_features, id_width
        self.target_columns = target_columns
        needed = expected_rows * row_bytes(storage_width(num_features, id_width, target_columns))
        free = shutil.disk_usage(self.directory).free
        if needed > free:
            raise ValueError(
                f"block_storage=disk needs {needed:,} bytes for this block in {self.directory}, which has "
                f"{free:,} free; free space there, point spark.local.dir (SPARK_LOCAL_DIRS) at a larger disk, "
                + ("set train.block_storage=stream (it reads the Parquet files in place, with nothing on the local "
                   "disk), " if from_files else "") + "or use more workers."
            )
        self.rows = 0
        self._files: list[IO[bytes]] = [self._unnamed() for _ in range(3 if id_width else 2)]

    def _unnamed(self) -> IO[bytes]:
        return tempfile.TemporaryFile(dir=self.directory)  # O_TMPFILE on Linux: never has a name

    def append(self, x: np.ndarray, y: np.ndarray, ids: np.ndarray | None = None) -> None:
        try:
            self._files[0].write(np.ascontiguousarray(x, dtype=np.float32).tobytes())
            self._files[1].write(np.ascontiguousarray(y, dtype=np.float64).tobytes())
            if self.id_width:
                self._files[2].write(np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        except OSError as err:
            self.close()
            raise ValueError(f"block_storage=disk could not write the block to {self.directory}: {err}") from err
        self.rows += int(x.shape[0])

    def finish(self, budget_bytes: int, device: torch.device) -> DiskBlock:
        for f in self._files:
            f.flush()
        return DiskBlock(self._files, self.rows, self.num_features, budget_bytes, device, self.target_columns,
                         self.id_width)

    def close(self) -> None:
        for f in self._files:
            f.close()


class DiskBlock:
    """The block in its files; `take` copies rows out through read-only mappings, within the budget.

    The first rows of the block, as many as fit in the budget less one streaming window (from a sixteenth
    of the budget, for a block just over it, to half of it, for a block over 1.5 times it), stay mapped
    for the run, one mapping per file, populated when first used (MAP_POPULATE): reading them costs what
    a memory block's rows do. The rows beyond are read through windows of that streaming size, mapped one
    at a time and unmapped at once. A block within the budget is kept whole; a much larger one is mostly
    streamed. Neither resident memory nor address space grows with the
    block (Spark's spark.executor.pyspark.memory limits a Python worker's address space).

    `disk`: the block is written once, as it arrives (Arrow batches from the
    shuffle, or row groups with blocks=files), to two unnamed files (three with an id matrix) in a
    Spark local directory of the executor (`SPARK_LOCAL_DIRS`, which Spark sets for its Python
    workers, so the disks users configured apply). The files are created with
    O_TMPFILE: they have no name, so nothing is left in the directory whatever
    happens to the process, a kill included, and the kernel frees them when the
    worker's last descriptor closes. While writing, the worker holds one incoming
    batch. Each step copies its local batch's rows out in the epoch order, exactly the
    rows and the order `memory` uses, so results are bitwise equal. It reads them
    in file order through read-only mappings of at most `train.memory_budget_mb`,
    one at a time, each unmapped at once: resident memory (and address space, which
    Spark's `spark.executor.pyspark.memory` limits) stays within the budget plus
    model, optimizer state and the batch, whatever the block's size; the data stays
    in the page cache between steps, as far as the worker's memory allows: the windows are read with
    MADV_RANDOM, so where a container's limit evicts the block's cache each fault reads one page, not a
    readahead window of pages no step uses. The rows that fit in the budget less one window are mapped
    once for the whole run instead (`DiskBlock`; all of them for a block within the budget), populated at
    once, so a step reads them from mapped pages, as fast as `memory` (the throughput benchmark measures
    both). Only the current batch goes to a GPU.
    """

    def __init__(self, files: list[IO[bytes]], rows: int, num_features: int, budget_bytes: int,
                 device: torch.device, target_columns: int = 1, id_width: int = 0) -> None:
        self.rows, self.num_features, self.id_width, self.device = rows, num_features, id_width, device
        self.target_shape = (target_columns,) if target_columns > 1 else ()
        self._files = files
        total = sum(os.fstat(f.fileno()).st_size for f in files)
        # The streaming window: small for a block just over the budget (most of it stays mapped), up to half
        # the budget for a much larger one (keeping a bit more of it would save little; every window a step
        # maps costs system calls).
        window = max(budget_bytes // 16, min(budget_bytes // 2, total - budget_bytes))
        self._window = max(window, 2 * PAGE + row_bytes(storage_width(num_features, id_width, target_columns)))
        if total <= budget_bytes:
            self.kept_rows = rows
        else:  # bytes per row over all the files (targets may be pairs), into what the stream window leaves
            self.kept_rows = max(0, (budget_bytes - self._window) // max(1, total // max(rows, 1)))
        self._kept: dict[int, mmap.mmap] = {}  # fileno -> the mapping of its first `kept_rows` rows
        self._direct: DirectReads | None = None
        self.direct_reads: bool | None = None  # whether `read_into` reads around the page cache (None: unused)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = idx.cpu().numpy()
        # Training on a GPU: the batch is gathered into pinned memory, so its copy to the device can be
        # non-blocking (the pinned allocator keeps each buffer until its copy is done).
        pinned = self.device.type == "cuda"
        x_host = torch.empty((len(rows), self.num_features), dtype=torch.float32, pin_memory=pinned)
        i_host = torch.empty((len(rows), self.id_width), dtype=torch.int64, pin_memory=pinned)
        y_host = torch.empty((len(rows), *self.target_shape), dtype=torch.float64, pin_memory=pinned)
        xb, ib, yb = x_host.numpy(), i_host.numpy(), y_host.numpy()
        if len(rows):
            if self.num_features:
                self._gather(self._files[0], rows, xb, 4 * self.num_features)
            if self.id_width:
                self._gather(self._files[2], rows, ib, 8 * self.id_width)
            self._gather(self._files[1], rows, yb, yb.itemsize * max(1, yb[0].size))
        return tuple(t.to(self.device, non_blocking=True) for t in (x_host, i_host, y_host))  # type: ignore[return-value]

    def empty(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Uninitialized (features, ids, targets) arrays for `rows` rows, page-aligned (`read_into` reads
        straight into them)."""
        return (aligned_empty((rows, self.num_features), np.float32), aligned_empty((rows, self.id_width), np.int64),
                aligned_empty((rows, *self.target_shape), np.float64))

    def read_into(self, lo: int, hi: int, out: tuple[np.ndarray, ...], at: int) -> None:
        """out[k][at:at + hi - lo] = rows [lo, hi) of the block: one sequential read from each file
        (epoch_order=chunks reads its windows this way, chunk by chunk), no mapping, around the page cache
        where the filesystem allows (`direct_io`)."""
        if self.direct_reads is None:
            self._direct = DirectReads.open(self._files)
            self.direct_reads = self._direct is not None
        rows = hi - lo
        for f, part in zip(self._files_by_kind(), out, strict=True):
            target = part[at:at + rows]
            if f is not None and target.size:  # no ids, or no features
                view, offset = memoryview(target.data).cast("B"), lo * (target.nbytes // rows)
                if self._direct is not None:
                    self._direct.read(f.fileno(), view, offset)
                else:
                    _pread_exactly(f.fileno(), view, offset)

    def _files_by_kind(self) -> list[IO[bytes] | None]:
        """(features, ids, targets) files, in the order of `take`'s tensors (None: no id file)."""
        return [self._files[0], self._files[2] if self.id_width else None, self._files[1]]

    def weights(self) -> torch.Tensor:
        """Every row's weight (8 bytes a row in memory), for the per-step weight sums; rows of
        (label, weight) only."""
        targets = np.empty((self.rows, *self.target_shape), dtype=np.float64)
        if self.rows:
            self._gather(self._files[1], np.arange(self.rows), targets, 8 * targets[0].size)
        return torch.from_numpy(np.ascontiguousarray(targets[:, 1]))

    def _gather(self, f: IO[bytes], rows: np.ndarray, out: np.ndarray, width: int) -> None:
        """out[i] = row rows[i] of `f`: from its kept mapping, or else through streaming windows."""
        kept = rows < self.kept_rows
        if kept.any():
            mapping = self._kept.get(f.fileno())
            if mapping is None:
                # Populated at once (one pass, in the first step): no step then takes a page fault on them.
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapping = self._kept[f.fileno()] = mmap.mmap(f.fileno(), self.kept_rows * width, flags=flags,
                                                             prot=mmap.PROT_READ)
                mapping.madvise(mmap.MADV_RANDOM)  # as below, should the kernel reclaim some of its pages
            view = np.frombuffer(mapping, dtype=out.dtype, count=self.kept_rows * width // out.itemsize)
            out[kept] = view.reshape(-1, *out.shape[1:])[rows[kept]]
            del view  # the mapping cannot close while an array still points into it
        if not kept.all():
            self._stream(f, rows, np.flatnonzero(~kept), out, width)

    def _stream(self, f: IO[bytes], rows: np.ndarray, positions: np.ndarray, out: np.ndarray, width: int) -> None:
        """out[p] = row rows[p] of `f` for each p in `positions`, in file order through windows mapped one
        at a time."""
        order = positions[np.argsort(rows[positions], kind="stable")]
        ordered = rows[order]
        windows = (ordered * width) // self._window
        cuts = np.flatnonzero(np.diff(windows)) + 1
        for part in np.split(np.arange(len(ordered)), cuts):
            first, last = int(ordered[part[0]]), int(ordered[part[-1]])
            lo, hi = first * width, (last + 1) * width
            start = lo - lo % mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(f.fileno(), hi - start, access=mmap.ACCESS_READ, offset=start) as window:
                # A step's rows are scattered: without this, each page fault of a block the page cache cannot
                # hold (a container's memory limit) reads ahead a whole readahead window it will not use.
                window.madvise(mmap.MADV_RANDOM)
                view = np.frombuffer(window, dtype=out.dtype, count=(hi - lo) // out.itemsize, offset=lo - start)
                out[order[part]] = view.reshape(-1, *out.shape[1:])[ordered[part] - first]
                del view  # the window cannot close while an array still points into it

    def close(self) -> None:
        for kept in self._kept.values():
            kept.close()
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        for f in self._files:
            f.close()


def _pread_exactly(fd: int, buffer: memoryview, offset: int) -> None:
    """Fill `buffer` from `fd` at `offset` (a regular file reads short only at its end: an error here)."""
    done = 0
    while done < len(buffer):
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got <= 0:
            raise OSError(f"the block's file ended {len(buffer) - done} bytes early at offset {offset + done}")
        done += got


Block = MemoryBlock | DiskBlock | StreamBlock
"""A rank's rows, wherever they are kept: `rows`, `take(idx)` (rows in idx order, on the device: features,
ids and targets, see `block_data.split_targets`), `weights()` (with per-row weights), `close()`."""
