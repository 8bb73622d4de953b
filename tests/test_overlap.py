"""train.overlap on Spark: BSP equivalence, bitwise reproducibility (run to run and through a relaunch),
the flat path's bits at 2 workers, fp16 per bucket, and the refused combinations."""

from __future__ import annotations

import pytest

from blocksync import TrainConfig, make_blocks, train
from blocksync.engine.comm.buckets import plan_buckets
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train
from tests.test_engine import small_config
from tests.test_faults import config as fault_config

pytestmark = pytest.mark.timeout(400)

SMALL_BUCKETS = 60 / 2**20  # 60 bytes: the 8 -> 16 -> 3 MLP's gradients fall into 3 buckets


def test_the_small_buckets_cut_the_test_model_into_three():
    assert plan_buckets([16 * 8, 16, 3 * 16, 3], int(SMALL_BUCKETS * 2**20)) == [[3, 2], [1], [0]]


@pytest.fixture(scope="module")
def blobs(spark):
    from tests.conftest import synthetic_classification

    return spark.createDataFrame(synthetic_classification(203, 8, 3, seed=7)).repartition(3)


@pytest.mark.parametrize("backend", ["horovod", "torch_gloo"])
def test_overlap_equals_single_process_training_and_repeats_bitwise(spark, blobs, backend):
    cfg = small_config(backend, "adam", overlap=True, bucket_mb=SMALL_BUCKETS)
    result = train(spark, blobs, cfg)
    blocks, _ = make_blocks(blobs, features="features", label="label", num_workers=4, seed=cfg.seed)
    reference = reference_train(collect_blocks(blocks, 4), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    again = train(spark, blobs, cfg)  # 4 workers on a ring: the same buckets, the same bits
    assert max_param_diff(result.model, again.model) == 0.0
    assert again.history == result.history
    flat = train(spark, blobs, small_config(backend, "adam", overlap=False))
    assert result.metrics["bytes_sent"] == flat.metrics["bytes_sent"]  # the same bytes, in buckets
    assert (result.metrics["overlap"], flat.metrics["overlap"]) == (True, False)


@pytest.mark.parametrize("backend,compression", [("torch_gloo", "none"), ("horovod", "none"), ("torch_gloo", "fp16")])
def test_overlap_at_two_workers_is_the_flat_path_bitwise(spark, blobs, backend, compression):
    cfg = small_config(backend, "sgd_momentum", num_workers=2, compression=compression, overlap=False)
    flat = train(spark, blobs, cfg)
    overlapped = train(spark, blobs, TrainConfig(**{**cfg.to_dict(), "overlap": True, "bucket_mb": SMALL_BUCKETS}))
    assert max_param_diff(flat.model, overlapped.model) == 0.0


def test_overlap_relaunched_from_a_checkpoint_ends_bitwise_identical(spark, tmp_path):
    from tests.conftest import synthetic_classification

    data = spark.createDataFrame(synthetic_classification(400, 8, 3, seed=9)).repartition(2)
    clean = train(spark, data, fault_config("torch_gloo", overlap=True, bucket_mb=SMALL_BUCKETS))
    faulty = train(spark, data, fault_config(
        "torch_gloo", overlap=True, bucket_mb=SMALL_BUCKETS, max_restarts=1,
        checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 5, "keep": 2},
        faults={"kill_rank": 1, "at_step": 12, "mode": "raise"},
    ))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [10] * 4
    assert max_param_diff(clean.model, faulty.model) == 0.0
    assert faulty.history == clean.history


@pytest.mark.parametrize("settings,message", [
    ({"backend": "spark"}, r"overlap=true needs an asynchronous all-reduce, and backend='spark' blocks"),
    ({"compression": "topk"}, r"compression='topk' compresses the whole gradient at once .* compression=none or fp16"),
    ({"compression": "powersgd"}, r"compression='powersgd' compresses the whole gradient"),
    ({"compression": "int8"}, r"compression='int8' compresses the whole gradient"),
    ({"sync": "parameters", "sync_every": 2}, r"sync='parameters' averages parameters after steps: set overlap=false"),
])
def test_overlap_refuses_what_cannot_run_per_bucket(settings, message):
    assert not TrainConfig(**settings).overlaps  # the default (null) leaves it off there, and says so in metrics
    with pytest.raises(ValueError, match=message):
        TrainConfig(overlap=True, **settings)


def test_overlap_is_on_by_default_where_it_can_run():
    assert TrainConfig().overlaps and TrainConfig(compression="fp16").overlaps
    assert not TrainConfig(overlap=False).overlaps
    # With shard=optimizer only when asked: the buckets cost Horovod its reduce-scatter, and a copy of the gradients.
    assert not TrainConfig(shard="optimizer").overlaps and TrainConfig(shard="optimizer", overlap=True).overlaps


def test_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match=r"bucket_mb=0 must be > 0"):
        TrainConfig(overlap=True, bucket_mb=0)


def test_the_spark_ml_params_reach_the_train_config():
    from blocksync.ml import BlockSyncClassifier

    cfg = BlockSyncClassifier(overlap=True, bucketMb=2.0, backend="torch_gloo").train_config("classification")
    assert (cfg.overlap, cfg.bucket_mb, cfg.backend) == (True, 2.0, "torch_gloo")
    with pytest.raises(ValueError, match=r"backend='spark' blocks"):
        BlockSyncClassifier(overlap=True, backend="spark").train_config("classification")


def test_backend_auto_chooses_by_the_measured_rule_and_says_why():
    from blocksync.engine.driver.backend_choice import choose_backend

    assert choose_backend(0, "auto", horovod_nccl=True) == (
        "torch_gloo", "CPU tasks: torch_gloo trains faster than Horovod on the CPU (benchmarks/README.md)")
    assert choose_backend(1, "auto", horovod_nccl=True)[0] == "horovod"
    assert choose_backend(1, "cpu", horovod_nccl=True)[0] == "torch_gloo"  # GPUs assigned, training on the CPU
    backend, reason = choose_backend(1, "cuda", horovod_nccl=False)
    assert backend == "torch_gloo" and "no Horovod built with NCCL" in reason


def test_backend_auto_is_resolved_before_launch_and_recorded(spark, blobs, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="blocksync.engine.driver.backend_choice")
    result = train(spark, blobs, small_config("auto", "adam", epochs=1))
    assert result.metrics["backend"] == "torch_gloo"  # local[4] has no GPUs
    assert result.metrics["overlap"] is True  # the default: on wherever it can run
    assert "backend=auto chose torch_gloo: CPU tasks" in caplog.text
