"""Per-row weights: the weighted global mean stays exact across workers (divided by the step's summed weights)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blocksync import ModelSpec, TrainConfig, TrainingError, make_blocks, train, train_blocks, train_files
from tests.conftest import synthetic_classification
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(300)


def weighted_frame(rows: int, seed: int) -> pd.DataFrame:
    pdf = synthetic_classification(rows, 6, 3, seed=seed)
    # Weights from 0 (the row does not count) to 4, and more weight on class 2: a real difference.
    rng = np.random.default_rng(seed)
    pdf["w"] = rng.integers(0, 5, rows) * 0.5 + (pdf["label"] == 2) * 1.5
    return pdf


def config(backend: str, **extra) -> TrainConfig:
    settings = dict(num_workers=3, backend=backend, epochs=3, batch_size=24, seed=2, check_every=4,
                    optimizer="adam", lr=0.02, model=ModelSpec(name="mlp", hidden=[8]))
    return TrainConfig(**{**settings, **extra})


@pytest.mark.parametrize("backend", ["horovod", "torch_gloo", "spark"])
def test_weighted_training_equals_the_single_process_weighted_mean(spark, backend):
    df = spark.createDataFrame(weighted_frame(130, seed=4))
    cfg = config(backend, epochs=1 if backend == "spark" else 3)  # the spark backend: about 1 s a step
    blocks, info = make_blocks(df, features="features", label="label", num_workers=3, seed=5, weight="w")
    assert blocks.columns == ["features", "label", "weight"]
    result = train_blocks(spark, blocks, info, cfg)
    reference = reference_train(collect_blocks(blocks, 3), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    # The weights matter: the unweighted reference on the same blocks ends elsewhere.
    unweighted = reference_train([b[:2] for b in collect_blocks(blocks, 3)], cfg, num_outputs=3)
    assert max_param_diff(result.model, unweighted) > 1e-3
    assert len({s["digest"] for s in result.rank_summaries}) == 1


def test_weighted_blocks_on_disk_train_bitwise_like_in_memory(spark):
    """block_storage=disk keeps (label, weight) pairs in its targets file and reads the weights back for
    the per-step sums: the run must be bitwise the memory run."""
    df = spark.createDataFrame(weighted_frame(100, seed=12))
    blocks, info = make_blocks(df, features="features", label="label", num_workers=3, seed=3, weight="w")
    runs = {storage: train_blocks(spark, blocks, info, config("torch_gloo", block_storage=storage, memory_budget_mb=1))
            for storage in ("memory", "disk")}
    assert runs["disk"].metrics["block_storage"] == "disk" and runs["memory"].metrics["block_storage"] == "memory"
    assert max_param_diff(runs["memory"].model, runs["disk"].model) == 0.0
    assert runs["memory"].history == runs["disk"].history


def test_weighted_local_sgd_and_regression_match_the_reference(spark):
    pdf = weighted_frame(120, seed=6)
    pdf["target"] = pdf["features"].map(lambda f: float(np.sum(f[:3])))
    df = spark.createDataFrame(pdf)
    cfg = config("torch_gloo", task="regression", sync="parameters", sync_every=3, optimizer="sgd", lr=0.01)
    blocks, info = make_blocks(df, features="features", label="target", num_workers=3, seed=1, weight="w")
    result = train_blocks(spark, blocks, info, cfg)
    reference = reference_train(collect_blocks(blocks, 3), cfg, num_outputs=1)
    assert max_param_diff(result.model, reference) <= 1e-5


def test_weights_from_parquet_files_and_a_relaunch_are_bitwise_equal(spark, tmp_path):
    pdf = weighted_frame(150, seed=8)
    table = pa.table({"features": pa.array(list(pdf["features"]), pa.list_(pa.float32())),
                      "label": pdf["label"], "w": pdf["w"]})
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=40)
    cfg = config("torch_gloo", num_workers=3)
    clean = train_files(spark, str(tmp_path / "data.parquet"), cfg, weight="w")
    x = np.stack(pdf["features"].to_numpy()).astype(np.float32)
    edges = [0, 50, 100, 150]  # contiguous, balanced row ranges
    blocks = [(x[a:b], pdf["label"].to_numpy()[a:b].astype(np.float64), pdf["w"].to_numpy()[a:b])
              for a, b in zip(edges[:-1], edges[1:], strict=True)]
    assert max_param_diff(clean.model, reference_train(blocks, cfg, num_outputs=3)) <= 1e-5
    faulty = train_files(spark, str(tmp_path / "data.parquet"), config(
        "torch_gloo", max_restarts=1, checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 4},
        faults={"kill_rank": 1, "at_step": 10, "mode": "raise"}), weight="w")
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [8] * 3
    assert max_param_diff(clean.model, faulty.model) == 0.0
    assert faulty.history == clean.history


def test_bad_weights_are_refused_with_the_column_named(spark, tmp_path):
    pdf = weighted_frame(60, seed=9)
    pdf.loc[[3, 17], "w"] = -1.0
    df = spark.createDataFrame(pdf)
    with pytest.raises(ValueError, match=r"^2 rows have a null, NaN, infinite or negative weight in column 'w'; "
                                         r"row weights must be finite numbers >= 0"):
        train(spark, df, config("torch_gloo", blocks="shuffle"), weight="w")
    with pytest.raises(ValueError, match=r"weight column 'nope' not in the DataFrame"):
        train(spark, df, config("torch_gloo"), weight="nope")
    with pytest.raises(ValueError, match=r"weight column 'features' is array<float>; row weights must be numbers"):
        train(spark, df, config("torch_gloo"), weight="features")
    # From files, each worker checks its own rows: every rank stops with the same one-line input error.
    table = pa.table({"features": pa.array(list(pdf["features"]), pa.list_(pa.float32())),
                      "label": pdf["label"], "w": pdf["w"]})
    pq.write_table(table, tmp_path / "bad.parquet")
    expected = r"rank \d\] ValueError: rank 0: 2 row weights are negative, NaN or infinite"
    with pytest.raises(TrainingError, match=expected) as err:
        train_files(spark, str(tmp_path / "bad.parquet"), config("torch_gloo"), weight="w")
    assert err.value.kind == "input"
    with pytest.raises(ValueError, match=r"weight column 'nope' is not a numeric column of the Parquet files"):
        train_files(spark, str(tmp_path / "bad.parquet"), config("torch_gloo"), weight="nope")


def test_the_driver_counts_a_weight_in_a_blocks_size(spark, tmp_path, monkeypatch):
    from blocksync.engine.driver import launcher

    pdf = weighted_frame(150, seed=8)  # 3 blocks of 50 rows, 6 features
    pq.write_table(pa.table({"features": pa.array(list(pdf["features"]), pa.list_(pa.float32())),
                             "label": pdf["label"], "w": pdf["w"]}), tmp_path / "data.parquet")
    # 50 x (6 x 4 + 8) = 1,600 B without weights, 50 x (6 x 4 + 8 + 8) = 2,000 B with: a worker of 1,800 B
    # holds the first and not the second.
    monkeypatch.setattr(launcher, "worker_memory", lambda spark, workers: (1_800, "a test's 1,800 B"))
    cfg = config("torch_gloo", block_storage="memory", epochs=1)
    refused = r"block_storage=memory: the largest block holds .* \(a test's 1,800 B\); set train.block_storage=disk"
    with pytest.raises(ValueError, match=refused):
        train_files(spark, str(tmp_path / "data.parquet"), cfg, weight="w")
    with pytest.raises(ValueError, match=refused):
        train(spark, spark.createDataFrame(pdf), cfg, weight="w")
    assert train_files(spark, str(tmp_path / "data.parquet"), cfg).metrics["block_storage"] == "memory"


def test_the_estimators_weight_col_is_train_with_weights(spark):
    from blocksync.ml import BlockSyncClassifier

    df = spark.createDataFrame(weighted_frame(90, seed=10))
    cfg = config("torch_gloo", num_workers=2, blocks="shuffle")
    expected = train(spark, df, cfg, weight="w").model.state_dict()
    model = (BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=3, batchSize=24, seed=2, checkEvery=4,
                                 optimizer="adam", lr=0.02, model={"name": "mlp", "hidden": [8]})
             .setWeightCol("w").fit(df))
    fitted = model.torchModule().state_dict()
    assert all(bool((fitted[k] == v).all()) for k, v in expected.items())
    unweighted = BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=3, batchSize=24, seed=2,
                                     optimizer="adam", lr=0.02, model={"name": "mlp", "hidden": [8]}).fit(df)
    assert any(bool((unweighted.torchModule().state_dict()[k] != v).any()) for k, v in expected.items())
