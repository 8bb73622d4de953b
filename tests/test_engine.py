"""The BSP engine: blocks, equivalence with single-process training, model averaging, real data, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from blocksync import BlockInfo, ModelSpec, TrainConfig, make_blocks, train, train_blocks
from blocksync.engine.driver.blocks import place_blocks
from blocksync.pipeline.datasets import digits_frame
from tests.conftest import synthetic_classification
from tests.helpers import accuracy, collect_blocks, split_standardized
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(300)

BACKENDS = ["horovod", "torch_gloo", "spark"]
OPTIMIZERS = {
    "sgd_momentum": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
    "adam": {"optimizer": "adam", "lr": 0.01},
}


def backend_optimizer_cases(spark_optimizer: str) -> list[tuple[str, str]]:
    """Every optimizer on horovod and torch_gloo, one on the spark backend: each rank steps its optimizer
    itself after the all-reduce, the same code on every backend, and the spark backend's all-reduce costs
    about a second per step."""
    return [(b, o) for b in BACKENDS if b != "spark" for o in OPTIMIZERS] + [("spark", spark_optimizer)]


@pytest.fixture(scope="module")
def blobs(spark):
    return spark.createDataFrame(synthetic_classification(203, 8, 3, seed=7)).repartition(3)


def small_config(backend: str, optimizer: str, **extra) -> TrainConfig:
    settings = dict(
        num_workers=4, backend=backend, epochs=5, batch_size=32, seed=3, check_every=5,
        model=ModelSpec(name="mlp", hidden=[16]), schedule="cosine", warmup_steps=3,
    )
    return TrainConfig(**{**settings, **OPTIMIZERS[optimizer], **extra})


def test_blocks_are_exact_balanced_and_deterministic(spark, blobs):
    blocks, info = make_blocks(blobs, features="features", label="label", num_workers=4, seed=11)
    sizes = [r["count"] for r in blocks.groupBy(F.spark_partition_id().alias("p")).count().orderBy("p").collect()]
    assert blocks.rdd.getNumPartitions() == 4
    assert sizes == info.sizes == [51, 51, 51, 50]
    # Same seed, differently partitioned input: the same blocks, row for row.
    again, _ = make_blocks(blobs.repartition(7), features="features", label="label", num_workers=4, seed=11)
    first = collect_blocks(blocks, 4)
    second = collect_blocks(again, 4)
    for (x1, y1), (x2, y2) in zip(first, second, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    other, _ = make_blocks(blobs, features="features", label="label", num_workers=4, seed=12)
    assert not np.array_equal(collect_blocks(other, 4)[0][1], first[0][1])


def test_feature_formats_give_the_same_blocks(spark, blobs):
    from pyspark.ml.functions import array_to_vector

    as_columns = blobs.select(*[F.col("features")[i].alias(f"f{i}") for i in range(8)], "label")
    as_vector = blobs.select(array_to_vector("features").alias("vec"), "label")
    ref = collect_blocks(make_blocks(blobs, features="features", label="label", num_workers=4, seed=1)[0], 4)
    for df, feats in ((as_columns, [f"f{i}" for i in range(8)]), (as_vector, "vec")):
        got = collect_blocks(make_blocks(df, features=feats, label="label", num_workers=4, seed=1)[0], 4)
        for (x1, y1), (x2, y2) in zip(ref, got, strict=True):
            # Whole rows (features and label together) in each block, whatever their order in it.
            np.testing.assert_array_equal(sorted_rows(x1, y1), sorted_rows(x2, y2))


def sorted_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[features..., label] rows in lexicographic order."""
    rows = np.column_stack([x.astype(np.float64), y])
    return rows[np.lexsort(rows.T[::-1])]


@pytest.mark.parametrize("backend,optimizer", backend_optimizer_cases("adam"))
def test_bsp_equals_single_process_training(spark, blobs, backend, optimizer):
    epochs = 2 if backend == "spark" else 5  # the spark backend costs about a second per step
    cfg = small_config(backend, optimizer, epochs=epochs)
    result = train(spark, blobs, cfg)
    assert result.metrics["steps"] == 7 * epochs  # ceil(203 / 32) per epoch
    blocks, _ = make_blocks(blobs, features="features", label="label", num_workers=4, seed=cfg.seed)
    reference = reference_train(collect_blocks(blocks, 4), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5


def unequal_blocks(spark, sizes: list[int]):
    pdf = synthetic_classification(sum(sizes), 8, 3, seed=21)
    pdf["block"] = np.repeat(np.arange(len(sizes)), sizes)
    pdf["order"] = np.arange(len(pdf))
    df = spark.createDataFrame(pdf)
    blocks = place_blocks(df, block="block", order=["order"], num_workers=len(sizes))
    return blocks, BlockInfo(num_features=8, sizes=sizes)


@pytest.mark.parametrize("backend,optimizer", backend_optimizer_cases("sgd_momentum"))
def test_bsp_equivalence_with_unequal_blocks(spark, backend, optimizer):
    sizes = [90, 50, 31, 9]  # the smallest block gets empty local batches in some steps
    blocks, info = unequal_blocks(spark, sizes)
    epochs = 1 if backend == "spark" else 3  # the spark backend costs about a second per step
    cfg = small_config(backend, optimizer, epochs=epochs, batch_size=16)
    result = train_blocks(spark, blocks, info, cfg)
    assert result.block_sizes == sizes
    assert result.metrics["steps"] == 12 * epochs  # ceil(180 / 16) per epoch, the same on every rank
    reference = reference_train(collect_blocks(blocks, 4), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5


def test_model_averaging_every_step_equals_gradient_sync(spark, blobs):
    common = dict(num_workers=4, backend="torch_gloo", epochs=3, batch_size=32, seed=5,
                  optimizer="sgd", lr=0.1, momentum=0.0, model=ModelSpec(name="mlp", hidden=[16]))
    grads = train(spark, blobs, TrainConfig(**common, sync="gradients"))
    params = train(spark, blobs, TrainConfig(**common, sync="parameters", sync_every=1))
    assert max_param_diff(grads.model, params.model) <= 1e-5
    assert params.metrics["sync"] == "parameters"


def test_local_sgd_k4_trains_and_stays_consistent(spark, blobs):
    # check_every=5 falls between averages (replicas differ there by design): the check waits for the
    # next average instead of reporting a divergence.
    cfg = TrainConfig(num_workers=4, backend="horovod", epochs=6, batch_size=32, seed=5, sync="parameters",
                      sync_every=4, optimizer="sgd", lr=0.1, check_every=5, model=ModelSpec(name="logreg"))
    result = train(spark, blobs, cfg)
    digests = {s["digest"] for s in result.rank_summaries}
    assert len(digests) == 1  # all replicas identical after the final average
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]


def test_local_sgd_k4_equals_the_local_sgd_reference(spark, blobs):
    # Blocks of 51, 51, 51, 50 rows: local batches of 7 or 8 rows, so the averages are weighted unequally;
    # momentum (per-rank optimizer state), warm-up and cosine decay; 35 steps = ceil(203 / 32) * 5, so the
    # last average comes after step 35, off the multiples of 4.
    cfg = TrainConfig(num_workers=4, backend="torch_gloo", epochs=5, batch_size=32, seed=3, sync="parameters",
                      sync_every=4, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3,
                      schedule="cosine", warmup_steps=3, check_every=4, model=ModelSpec(name="mlp", hidden=[16]))
    result = train(spark, blobs, cfg)
    assert result.metrics["steps"] == 35 and result.metrics["sync"] == "parameters"
    blocks, _ = make_blocks(blobs, features="features", label="label", num_workers=4, seed=cfg.seed)
    reference = reference_train(collect_blocks(blocks, 4), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    # The reference really is local SGD: with K=4 it ends far from gradient-sync training on the same batches.
    bsp = reference_train(collect_blocks(blocks, 4), dataclasses.replace(cfg, sync="gradients"), num_outputs=3)
    assert max_param_diff(bsp, reference) > 1e-3


@pytest.fixture(scope="module")
def digits(spark):
    df = digits_frame(spark)
    return split_standardized(df, [f"pixel_{i}" for i in range(64)], test_fraction=0.2, seed=42)


def test_mlp_on_digits_reaches_95_percent(spark, digits):
    train_df, test_df, _ = digits
    cfg = TrainConfig(num_workers=4, backend="horovod", epochs=30, batch_size=64, lr=2e-3, seed=0,
                      model=ModelSpec(name="mlp", hidden=[128, 64]))
    result = train(spark, train_df, cfg)
    acc = accuracy(result.model, test_df)
    assert acc >= 0.95, acc
    assert result.metrics["num_workers"] == 4 and result.metrics["backend"] == "horovod"
    assert 0.0 < result.metrics["sync_fraction"] < 1.0
    assert result.metrics["samples_per_sec"] > 0


def test_cnn_on_digits_learns(spark, digits):
    train_df, test_df, _ = digits
    cfg = TrainConfig(num_workers=4, backend="torch_gloo", epochs=8, batch_size=64, lr=3e-3,
                      model=ModelSpec(name="cnn"))
    assert accuracy(train(spark, train_df, cfg).model, test_df) >= 0.9


def test_model_from_import_path(spark, blobs):
    cfg = TrainConfig(num_workers=2, backend="spark", epochs=1, batch_size=101,
                      model=ModelSpec(name="tests.custom_models:tiny_net", options={"width": 5}))
    result = train(spark, blobs, cfg)
    assert result.model[0].out_features == 5


# --- user errors, each pinned by its message ---------------------------------

def test_more_workers_than_slots(spark, blobs):
    with pytest.raises(ValueError, match=r"num_workers=5 but the cluster has 4 task slots; lower num_workers"):
        train(spark, blobs, TrainConfig(num_workers=5))


def test_missing_feature_column(spark, blobs):
    with pytest.raises(ValueError, match=r"feature column\(s\) \['pixels'\] not in the DataFrame"):
        train(spark, blobs, TrainConfig(num_workers=2), features="pixels")


def test_missing_label_column(spark, blobs):
    with pytest.raises(ValueError, match=r"label column 'target' not in the DataFrame"):
        train(spark, blobs, TrainConfig(num_workers=2), label="target")


def test_non_numeric_features(spark):
    df = spark.createDataFrame(pd.DataFrame({"a": ["x", "y"], "b": [1.0, 2.0], "label": [0, 1]}))
    with pytest.raises(ValueError, match=r"feature column\(s\) \{'a': 'string'\} are not numeric"):
        train(spark, df, TrainConfig(num_workers=2), features=["a", "b"])


def test_empty_data(spark, blobs):
    with pytest.raises(ValueError, match=r"the training data is empty \(0 rows\)"):
        train(spark, blobs.limit(0), TrainConfig(num_workers=2))


def test_fewer_rows_than_workers(spark, blobs):
    with pytest.raises(ValueError, match=r"only 3 training rows for num_workers=4"):
        train(spark, blobs.limit(3), TrainConfig(num_workers=4))


def test_labels_not_class_indices(spark, blobs):
    df = blobs.withColumn("label", F.col("label") - 1)
    with pytest.raises(ValueError, match=r"classification labels must be class indices 0..K-1 \(found min -1"):
        train(spark, df, TrainConfig(num_workers=2))


def test_bad_config_values():
    with pytest.raises(ValueError, match=r"backend='mpi' is not one of horovod, torch_gloo, spark"):
        TrainConfig(backend="mpi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_workers=0 must be > 0"):
        TrainConfig(num_workers=0)
