"""block_storage=stream: blocks read straight from their Parquet files every epoch, in the chunk order."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from blocksync import ModelSpec, TrainConfig, TrainingError, train_files
from blocksync.engine.driver.shards import plan_shards
from blocksync.engine.driver.storage import resolve_storage
from blocksync.engine.plan import ChunkLayout
from blocksync.engine.worker.epoch_order import chunk_order
from blocksync.engine.worker.shard_reader import read_block
from blocksync.engine.worker.stream_block import FileChanged, StreamBlock
from blocksync.engine.worker.window_reader import WindowFeed, open_feed
from tests.conftest import synthetic_classification
from tests.reference import max_param_diff

pytestmark = pytest.mark.timeout(600)

FILE_ROWS = [90, 7, 106]  # row groups of 25 rows straddle the block boundaries and the chunks


def write_files(folder, seed: int = 5, weights: bool = False):
    folder.mkdir()
    pdf = synthetic_classification(sum(FILE_ROWS), 8, 3, seed=seed)
    x = np.stack(pdf["features"].to_numpy()).astype(np.float32)
    y = pdf["label"].to_numpy()
    w = np.random.default_rng(seed).random(len(y)) * 2
    start = 0
    for i, n in enumerate(FILE_ROWS):
        part = slice(start, start + n)
        columns = {"features": pa.array(list(x[part]), pa.list_(pa.float32())), "label": y[part]}
        if weights:
            columns["weight"] = w[part]
        pq.write_table(pa.table(columns), folder / f"part-{i:05d}.parquet", row_group_size=25)
        start += n
    return str(folder)


def no_problem(x, ids, y) -> str:
    return ""


@pytest.mark.parametrize("filesystem", ["local", "other"])
def test_a_stream_block_reads_the_rows_a_loaded_block_holds(tmp_path, filesystem):
    """Local files are read around the page cache; any other pyarrow filesystem (here a SubTreeFileSystem over
    the same files, standing for HDFS or S3) through pyarrow's reader: the same rows either way."""
    plan, info = plan_shards(None, write_files(tmp_path / "data"), features="features", label="label", num_workers=2)
    assert set(plan.file_facts) == {str(tmp_path / "data" / f"part-0000{i}.parquet") for i in range(3)}
    x, y = read_block(plan, 1, 8)
    if filesystem == "other":
        plan = dataclasses.replace(plan, filesystem=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()))
    block = StreamBlock(plan, 1, 8, no_problem)
    order = chunk_order(block.rows, 1, 1, 0, ChunkLayout(9, 2))  # 9-row chunks, 18-row windows
    feed = open_feed(block, order, 0, __import__("torch").device("cpu"))
    assert isinstance(feed, WindowFeed)
    try:
        for lo in range(0, block.rows, 7):
            hi = min(lo + 7, block.rows)
            xb, _, yb = feed.take(lo, hi)
            np.testing.assert_array_equal(xb.numpy(), x[order.rows[lo:hi]])
            np.testing.assert_array_equal(yb.numpy(), y[order.rows[lo:hi]])
        assert block.direct_reads is (filesystem == "local")
    finally:
        feed.close()
        block.close()


@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_a_file_that_changes_or_disappears_while_streaming_is_named(tmp_path, change):
    folder = write_files(tmp_path / "data")
    plan, _ = plan_shards(None, folder, features="features", label="label", num_workers=1)
    block = StreamBlock(plan, 0, 8, no_problem)
    out = block.empty(203)
    block.read_into(0, 50, out, 0)  # the first file's first two row groups
    victim = tmp_path / "data" / "part-00002.parquet"
    if change == "deleted":
        os.remove(victim)
    else:
        pq.write_table(pa.table({"features": pa.array([[0.0] * 8], pa.list_(pa.float32())), "label": [1]}), victim)
    block.read_into(50, 97, out, 50)  # files not touched read on
    what = "disappeared" if change == "deleted" else "changed"
    with pytest.raises(FileChanged, match=rf"the Parquet file {victim} {what} during training.*keep them"):
        block.read_into(97, 203, out, 97)
    with pytest.raises(FileChanged, match=rf"the Parquet file {victim} {what} during training"):
        StreamBlock(plan, 0, 8, no_problem)  # a worker starting after the driver planned checks first
    block.close()


def test_stream_needs_files_and_the_chunk_order():
    with pytest.raises(ValueError, match=r"block_storage=stream reads each block from its Parquet files in the chunk "
                                         r"order: set train.epoch_order=chunks \(now global\)"):
        TrainConfig(block_storage="stream")
    with pytest.raises(ValueError, match=r"and train from Parquet files \(blocks=files or auto; now shuffle\)"):
        TrainConfig(block_storage="stream", epoch_order="chunks", blocks="shuffle")
    cfg = TrainConfig(block_storage="stream", epoch_order="chunks", num_workers=2)
    with pytest.raises(ValueError, match=r"block_storage=stream reads each block from Parquet files, and this run's "
                                         r"blocks come from a Spark shuffle: train from Parquet files"):
        resolve_storage(cfg, [10, 10], 8, 1, None, has_files=False)
    assert resolve_storage(cfg, [10, 10], 8, 1, None, has_files=True) == "stream"


def config(storage: str, **extra) -> TrainConfig:
    settings = dict(num_workers=4, backend="torch_gloo", epochs=3, batch_size=32, seed=3, check_every=5,
                    optimizer="adam", lr=0.01, model=ModelSpec(name="mlp", hidden=[16]), memory_budget_mb=1,
                    block_storage=storage, epoch_order="chunks", chunk_mb=0.0003, shuffle_window_mb=0.001)
    return TrainConfig(**{**settings, **extra})


def test_stream_trains_bitwise_like_memory_and_disk_and_relaunches_bitwise(spark, tmp_path):
    path = write_files(tmp_path / "data", weights=True)
    runs = {s: train_files(spark, path, config(s), weight="weight") for s in ("memory", "stream", "disk")}
    # Killed at step 12 of 21 (7 steps an epoch): resumed from the checkpoint of step 10, in the middle of epoch 2.
    runs["relaunched"] = train_files(spark, path, config("stream", max_restarts=1, checkpoint={
        "dir": str(tmp_path / "ckpt"), "every_steps": 5}, faults={"kill_rank": 1, "at_step": 12, "mode": "exit"}),
        weight="weight")
    assert [s["resumed_at"] for s in runs["relaunched"].rank_summaries] == [10] * 4
    for other in ("stream", "disk", "relaunched"):
        assert max_param_diff(runs["memory"].model, runs[other].model) == 0.0
        assert runs["memory"].history == runs[other].history
    assert runs["stream"].metrics["block_storage"] == "stream"
    assert all(s["read_seconds"] > 0 for s in runs["stream"].rank_summaries)


def test_a_streamed_file_gone_before_the_workers_read_it_stops_the_run_naming_it(spark, tmp_path, monkeypatch):
    import blocksync.engine.driver.launcher as launcher

    path = write_files(tmp_path / "data")
    victim = str(tmp_path / "data" / "part-00001.parquet")
    planned = launcher.plan_shards

    def plan_then_delete(*args, **kwargs):
        result = planned(*args, **kwargs)
        os.remove(victim)  # after the driver read the footers, before any worker reads
        return result

    monkeypatch.setattr(launcher, "plan_shards", plan_then_delete)
    with pytest.raises(TrainingError, match=rf"the Parquet file {victim} disappeared during training"):
        train_files(spark, path, config("stream"))


def test_rows_are_checked_as_they_are_streamed_naming_the_file(tmp_path):
    plan, _ = plan_shards(None, write_files(tmp_path / "data"), features="features", label="label", num_workers=1)
    block = StreamBlock(plan, 0, 8, lambda x, ids, y: "2 labels are not class indices in [0, 3)" if y.max() > 1 else "")
    out = block.empty(203)
    with pytest.raises(ValueError, match=rf"2 labels are not class indices in \[0, 3\) \(in {tmp_path}/data/"
                                         r"part-00000.parquet, read by block_storage=stream\)"):
        block.read_into(0, 25, out, 0)
    block.close()
