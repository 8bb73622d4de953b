"""train.epoch_order=chunks in real runs: equal to the single-process reference on every backend, bitwise
the same in memory and on disk, and bitwise after a relaunch in the middle of an epoch."""

from __future__ import annotations

import dataclasses

import pytest

from blocksync import ModelSpec, TrainConfig, make_blocks, train
from tests.conftest import synthetic_classification
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(600)

# 40-byte rows (8 features, a label): chunk_mb gives floor(314 / 40) = 7-row chunks and shuffle_window_mb
# floor(1048 / 280) = 3-chunk (21-row) windows, so each block of about 51 rows is read in 3 windows, and the
# local batches of about 8 rows often straddle two of them.
CHUNKS = dict(epoch_order="chunks", chunk_mb=0.0003, shuffle_window_mb=0.001)


@pytest.fixture(scope="module")
def blobs(spark):
    return spark.createDataFrame(synthetic_classification(203, 8, 3, seed=7)).repartition(3)


def config(backend: str, **extra) -> TrainConfig:
    settings = dict(num_workers=4, backend=backend, epochs=4, batch_size=32, seed=3, check_every=5,
                    optimizer="adam", lr=0.01, schedule="cosine", warmup_steps=3,
                    model=ModelSpec(name="mlp", hidden=[16]), memory_budget_mb=1, **CHUNKS)
    return TrainConfig(**{**settings, **extra})


@pytest.mark.parametrize("backend,storage", [("horovod", "disk"), ("torch_gloo", "memory"), ("spark", "disk")])
def test_the_chunk_order_trains_like_the_single_process_reference(spark, blobs, backend, storage):
    epochs = 2 if backend == "spark" else 4  # the spark backend costs about a second per step
    cfg = config(backend, epochs=epochs, block_storage=storage)
    result = train(spark, blobs, cfg)
    assert result.metrics["steps"] == 7 * epochs and result.metrics["block_storage"] == storage
    blocks = collect_blocks(make_blocks(blobs, features="features", label="label", num_workers=4, seed=cfg.seed)[0], 4)
    assert max_param_diff(result.model, reference_train(blocks, cfg, num_outputs=3)) <= 1e-5
    # The order matters: the global permutation's reference ends elsewhere.
    other = reference_train(blocks, dataclasses.replace(cfg, epoch_order="global"), num_outputs=3)
    assert max_param_diff(result.model, other) > 1e-3


def same_run(a, b) -> None:
    assert max_param_diff(a.model, b.model) == 0.0  # bitwise, on CPU
    assert a.history == b.history


def test_memory_and_disk_train_bitwise_alike_in_the_chunk_order_and_a_relaunch_resumes_mid_epoch(spark, blobs,
                                                                                                   tmp_path):
    memory = train(spark, blobs, config("horovod", block_storage="memory"))
    disk = train(spark, blobs, config("horovod", block_storage="disk"))
    same_run(memory, disk)
    assert all(s["read_seconds"] > 0 for s in disk.rank_summaries)  # the window reader ran
    assert all(s["read_seconds"] == 0 for s in memory.rank_summaries)
    # 7-row chunks of 32-byte feature rows are never page-aligned: every read goes through the bounce buffer.
    assert disk.metrics["direct_reads"] == [True] * 4 and memory.metrics["direct_reads"] == [None] * 4
    # Killed at step 12 of 28: the checkpoint of step 10 is in epoch 2 (7 steps an epoch), mid-window.
    faulty = train(spark, blobs, config("horovod", block_storage="disk", max_restarts=1,
                                        checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 5},
                                        faults={"kill_rank": 1, "at_step": 12, "mode": "exit"}))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [10] * 4
    same_run(memory, faulty)
