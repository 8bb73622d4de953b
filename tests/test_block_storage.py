"""train.block_storage: blocks on the executors' local disk give bitwise the result of blocks in memory;
the files never have a name; the driver refuses what cannot fit, before launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from blocksync import ModelSpec, TrainConfig, train, train_blocks, train_files
from blocksync.engine.driver.storage import resolve_storage
from blocksync.engine.worker.block_store import DiskBlockWriter, MemoryBlock, min_budget_bytes, row_bytes, storage_width
from tests.conftest import synthetic_classification
from tests.reference import max_param_diff
from tests.test_engine import unequal_blocks

pytestmark = pytest.mark.timeout(600)


def block_arrays(rows: int, features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, features)).astype(np.float32), rng.integers(0, 3, rows).astype(np.float64)


@pytest.mark.parametrize(("budget", "kept"), [(2 * 4096, 0), (40_000, 333), (2**20, 1000)])
def test_a_disk_block_gives_the_rows_a_memory_block_gives(tmp_path, budget, kept):
    """Windows of two pages only (most steps read through several of them); the first rows kept mapped and
    the rest streamed; the whole block kept (within the budget). With typed inputs' int64 ids beside the
    features: 60 bytes a row (7 x 4 + 8 + 3 x 8)."""
    x, y = block_arrays(1000, 7)
    ids = np.random.default_rng(2).integers(0, 2**40, size=(1000, 3))
    writer = DiskBlockWriter(7, 1000, str(tmp_path), id_width=3)
    for lo in range(0, 1000, 128):  # as batches arrive
        writer.append(x[lo:lo + 128], y[lo:lo + 128], ids[lo:lo + 128])
    disk = writer.finish(budget_bytes=budget, device=torch.device("cpu"))
    # The block is 60,000 bytes: a 40,000-byte budget less a window of half of it keeps 20,000 // 60 = 333 rows.
    assert disk.kept_rows == kept
    memory = MemoryBlock(x.copy(), y.copy(), torch.device("cpu"), ids.copy())
    try:
        assert os.listdir(tmp_path) == []  # the files have no name
        order = torch.from_numpy(np.random.default_rng(1).permutation(1000))
        for lo in range(0, 1000, 37):
            idx = order[lo:lo + 37]
            for a, b in zip(disk.take(idx), memory.take(idx), strict=True):
                assert torch.equal(a, b)
        assert disk.rows == 1000
    finally:
        disk.close()
    assert os.listdir(tmp_path) == []


KILLED_WRITER = """
import os, signal, sys
import numpy as np
from blocksync.engine.worker.block_store import DiskBlockWriter
writer = DiskBlockWriter(4, 100, sys.argv[1])
writer.append(np.ones((60, 4), np.float32), np.zeros(60))
print(len(os.listdir(sys.argv[1])), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_worker_leaves_nothing_in_the_local_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.strip() == "0"  # nothing named in the directory while writing
    assert os.listdir(tmp_path) == []


def test_a_local_dir_without_room_is_named_with_the_bytes_needed(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(ValueError, match=rf"block_storage=disk needs 6,000 bytes for this block in {tmp_path}, "
                                         r"which has 1,000 free; .*SPARK_LOCAL_DIRS.*, or use more workers") as err:
        DiskBlockWriter(4, 250, str(tmp_path))  # 250 rows x (4 x 4 + 8) bytes
    assert "stream" not in str(err.value)  # rows of a Spark shuffle cannot be streamed
    with pytest.raises(ValueError, match=r"SPARK_LOCAL_DIRS.*, set train.block_storage=stream \(it reads the Parquet "
                                         r"files in place"):
        DiskBlockWriter(4, 250, str(tmp_path), from_files=True)  # blocks=files
    assert os.listdir(tmp_path) == []


def test_the_size_the_driver_counts_is_what_a_block_with_weights_and_ids_takes_on_disk(tmp_path):
    writer = DiskBlockWriter(3, 50, str(tmp_path), target_columns=2, id_width=2)
    writer.append(np.ones((50, 3), np.float32), np.ones((50, 2)), np.zeros((50, 2), np.int64))
    block = writer.finish(2**20, torch.device("cpu"))
    try:
        on_disk = sum(os.fstat(f.fileno()).st_size for f in block._files)
    finally:
        block.close()
    assert on_disk == 50 * (3 * 4 + 2 * 8 + 2 * 8)  # float32 features, int64 ids, float64 label and weight
    assert 50 * row_bytes(storage_width(3, 2, target_columns=2)) == on_disk


def test_the_driver_resolves_and_refuses_storage_before_launch():
    cfg = TrainConfig(num_workers=2, block_storage="auto", memory_budget_mb=64)
    block = 100_000 * row_bytes(16)  # 100,000 rows of 16 features: 7.2 MB
    assert resolve_storage(cfg, [100_000, 100_000], 16, 100, (4 * block, "test")) == "memory"
    assert resolve_storage(cfg, [100_000, 100_000], 16, 100, (block, "test")) == "disk"  # over half
    assert resolve_storage(cfg, [100_000, 100_000], 16, 100, None) == "memory"  # unknown: as before
    memory = TrainConfig(num_workers=2, block_storage="memory")
    with pytest.raises(ValueError, match=r"block_storage=memory: the largest block holds 7 MiB but a Python worker "
                                         r"has 4 MiB \(spark.executor.pyspark.memory=8m over 2 core\(s\)\); set "
                                         r"train.block_storage=disk \(or auto\), or raise num_workers"):
        resolve_storage(memory, [100_000, 99_999], 16, 100, (4 * 2**20, "spark.executor.pyspark.memory=8m over "
                                                                          "2 core(s)"))
    tiny = TrainConfig(num_workers=2, block_storage="disk", memory_budget_mb=1)
    needed = -(-min_budget_bytes(20_000, 16) // 2**20)  # 20,000 rows x 72 B: 1.4 MB, over 1 MiB
    with pytest.raises(ValueError, match=rf"train.memory_budget_mb=1 cannot hold one local batch of 20000 rows read "
                                         rf"from disk; it needs at least {needed}\."):
        resolve_storage(tiny, [100_000, 100_000], 16, 5, None)
    assert needed == 2
    assert resolve_storage(tiny, [100_000, 100_000], 16, 100, None) == "disk"  # 1,000-row local batches fit


def config(backend: str, storage: str, **extra) -> TrainConfig:
    settings = dict(num_workers=4, backend=backend, epochs=3, batch_size=32, seed=3, check_every=5,
                    block_storage=storage, memory_budget_mb=1, optimizer="adam", lr=0.01,
                    model=ModelSpec(name="mlp", hidden=[16]))
    return TrainConfig(**{**settings, **extra})


def same_run(a, b) -> None:
    assert max_param_diff(a.model, b.model) == 0.0  # bitwise, on CPU
    assert a.history == b.history


@pytest.mark.parametrize("backend,blocks", [("horovod", "shuffle"), ("torch_gloo", "files"), ("spark", "shuffle")])
def test_disk_blocks_train_bitwise_like_memory_blocks(spark, tmp_path, backend, blocks):
    pdf = synthetic_classification(403, 8, 3, seed=5)
    extra = {"epochs": 1, "batch_size": 100} if backend == "spark" else {}  # about a second a step via the driver
    if blocks == "files":
        path = str(tmp_path / "data.parquet")
        spark.createDataFrame(pdf).repartition(3).write.parquet(path)
        runs = {s: train_files(spark, path, config(backend, s, **extra)) for s in ("memory", "disk")}
    else:
        df = spark.createDataFrame(pdf).repartition(3)
        runs = {s: train(spark, df, config(backend, s, **extra)) for s in ("memory", "disk")}
    same_run(runs["memory"], runs["disk"])
    assert runs["disk"].metrics["block_storage"] == "disk" and runs["memory"].metrics["block_storage"] == "memory"
    assert all(p > 0 for p in runs["disk"].metrics["peak_rss_mb"])  # every rank's VmHWM, as the OS counts it


def test_unequal_disk_blocks_train_bitwise_like_memory_blocks(spark):
    blocks, info = unequal_blocks(spark, [90, 50, 31, 9])  # the smallest block has empty local batches
    runs = {s: train_blocks(spark, blocks, info, config("torch_gloo", s, batch_size=16)) for s in ("memory", "disk")}
    same_run(runs["memory"], runs["disk"])


def test_a_disk_block_run_relaunches_bitwise_equal(spark, tmp_path):
    df = spark.createDataFrame(synthetic_classification(400, 8, 3, seed=9)).repartition(2)
    clean = train(spark, df, config("horovod", "memory"))
    faulty = train(spark, df, config("horovod", "disk", max_restarts=1,
                                     checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 5},
                                     faults={"kill_rank": 1, "at_step": 12, "mode": "exit"}))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [10] * 4
    same_run(clean, faulty)


def top_level_files(spark) -> set[str]:
    """Files directly in the Spark local dirs its Python workers get (where disk blocks are created)."""
    dirs = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("SPARK_LOCAL_DIRS", "")).collect()[0]
    assert dirs, "the Python workers got no SPARK_LOCAL_DIRS"
    return {str(p) for d in dirs.split(",") for p in Path(d).iterdir() if p.is_file()}


def test_disk_blocks_leave_nothing_after_success_kill_or_stall(spark, tmp_path):
    from blocksync import TrainingError

    df = spark.createDataFrame(synthetic_classification(400, 8, 3, seed=9)).repartition(2)
    before = top_level_files(spark)
    train(spark, df, config("torch_gloo", "disk", epochs=1))  # success
    # A killed worker: the driver hears first either that it ended or that a peer lost it (a race).
    with pytest.raises(TrainingError, match=r"rank 1's Python worker ended without finishing|closed by peer"):
        train(spark, df, config("torch_gloo", "disk", faults={"kill_rank": 1, "at_step": 3, "mode": "exit"}))
    with pytest.raises(TrainingError, match=r"stalled: rank 2 at step 4"):  # a stall, cancelled by the driver
        train(spark, df, config("torch_gloo", "disk", timeouts={"step_seconds": 3},
                                faults={"kill_rank": 2, "at_step": 4, "mode": "hang"}))
    assert top_level_files(spark) == before
