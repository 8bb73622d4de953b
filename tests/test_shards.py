"""blocks=files: workers read balanced row ranges of Parquet files themselves (no Spark shuffle)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blocksync import ModelSpec, TrainConfig, TrainingError, train, train_files
from blocksync.engine.driver.scan import parquet_scan_files, pyarrow_opens
from blocksync.engine.driver.shards import plan_shards
from blocksync.engine.worker.shard_reader import read_block
from tests.conftest import synthetic_classification
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(300)

# Files of uneven length, with row groups that straddle the block boundaries.
FILE_ROWS = [90, 7, 0, 106]
ROW_GROUP = 25


def write_files(folder, x: np.ndarray, y: np.ndarray, *, as_columns: bool = False, **options) -> None:
    folder.mkdir()
    start = 0
    for i, n in enumerate(FILE_ROWS):
        part = slice(start, start + n)
        if as_columns:
            table = pa.table({**{f"f{j}": x[part, j] for j in range(x.shape[1])}, "label": y[part]})
        else:
            table = pa.table({"features": pa.array(list(x[part]), pa.list_(pa.float32())), "label": y[part]})
        pq.write_table(table, folder / f"part-{i:05d}.parquet", row_group_size=ROW_GROUP, **options)
        start += n
    (folder / "_SUCCESS").touch()  # what Spark leaves beside its files; not data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    pdf = synthetic_classification(sum(FILE_ROWS), 8, 3, seed=5)
    x = np.stack(pdf["features"].to_numpy()).astype(np.float32)
    y = pdf["label"].to_numpy()
    root = tmp_path_factory.mktemp("shards")
    write_files(root / "arrays", x, y)
    write_files(root / "columns", x, y, as_columns=True)
    write_files(root / "nostats", x, y, write_statistics=False)
    return root, x, y


def expected_blocks(x: np.ndarray, y: np.ndarray, sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return [(x[a:b], y[a:b].astype(np.float64)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


@pytest.mark.parametrize("layout", ["arrays", "columns"])
def test_every_row_is_read_once_in_balanced_contiguous_blocks(data, layout):
    root, x, y = data
    features = "features" if layout == "arrays" else [f"f{j}" for j in range(8)]
    plan, info = plan_shards(None, str(root / layout), features=features, label="label", num_workers=4)
    assert info.sizes == [51, 51, 51, 50] and info.num_features == 8
    assert info.labels == (0.0, 2.0, 0)  # from the row-group statistics, no Spark job
    for rank, (ex, ey) in enumerate(expected_blocks(x, y, info.sizes)):
        got_x, got_y = read_block(plan, rank, 8)
        np.testing.assert_array_equal(got_x, ex)
        np.testing.assert_array_equal(got_y, ey)


def test_files_without_statistics_get_their_label_range_from_spark(spark, data):
    root, _, y = data
    _, info = plan_shards(spark, str(root / "nostats"), features="features", label="label", num_workers=2)
    assert info.labels == (float(y.min()), float(y.max()), 0)


@pytest.mark.parametrize("backend", ["horovod", "torch_gloo"])
def test_train_files_equals_single_process_training_on_the_same_blocks(spark, data, backend):
    root, x, y = data
    cfg = TrainConfig(num_workers=4, backend=backend, epochs=3, batch_size=32, seed=3, check_every=5,
                      optimizer="adam", lr=0.01, model=ModelSpec(name="mlp", hidden=[16]))
    result = train_files(spark, str(root / "arrays"), cfg)
    assert result.block_sizes == [51, 51, 51, 50]
    assert result.metrics["steps"] == 21  # ceil(203 / 32) * 3
    reference = reference_train(expected_blocks(x, y, [51, 51, 51, 50]), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5


def test_train_with_blocks_files_asks_for_the_path(spark, data):
    with pytest.raises(ValueError, match=r"blocks=files reads Parquet files directly.*train_files\(spark, path"):
        train(spark, spark.createDataFrame([([1.0], 0)], "features array<float>, label int"),
              TrainConfig(num_workers=2, blocks="files"))


def test_a_plain_parquet_scan_is_recognized_and_nothing_else(spark, data, tmp_path):
    root, _, _ = data
    arrays = spark.read.parquet(str(root / "arrays"))
    files = sorted(p.name for p in (root / "arrays").glob("*.parquet"))
    found = parquet_scan_files(arrays, ["features", "label"])
    assert found is not None and [f.rsplit("/", 1)[1] for f in found] == files
    assert parquet_scan_files(arrays.select("label", "features"), ["features", "label"]) == found
    columns = spark.read.parquet(str(root / "columns"))
    assert parquet_scan_files(columns.select("f0", "f1", "label"), ["f0", "f1", "label"]) is not None
    # Anything that changes the rows or computes a column is cut by Spark.
    for changed in (arrays.filter("label > 0"), arrays.withColumn("label", arrays.label + 1),
                    arrays.select(arrays.features.alias("features"), (arrays.label * 2).alias("label")),
                    arrays.limit(50), arrays.sample(0.5, seed=1),
                    arrays.join(arrays.select("label").distinct(), "label"), spark.createDataFrame(arrays.toPandas())):
        assert parquet_scan_files(changed, ["features", "label"]) is None
    assert parquet_scan_files(arrays, ["features", "missing"]) is None
    assert not pyarrow_opens("s3a://bucket/data/part-0.parquet")  # Hadoop's scheme: Spark reads it, pyarrow not
    # A label that lives in partition directories is not in the files: Spark cuts those blocks.
    arrays.write.partitionBy("label").parquet(str(tmp_path / "by_label"))
    assert parquet_scan_files(spark.read.parquet(str(tmp_path / "by_label")), ["features", "label"]) is None


def test_blocks_auto_reads_a_parquet_dataframe_like_train_files(spark, data):
    root, _, _ = data
    cfg = TrainConfig(num_workers=4, backend="torch_gloo", epochs=2, batch_size=32, seed=3,
                      model=ModelSpec(name="mlp", hidden=[16]))
    files = train_files(spark, str(root / "arrays"), cfg)
    auto = train(spark, spark.read.parquet(str(root / "arrays")), cfg)
    assert auto.metrics["blocks"] == files.metrics["blocks"] == "files"
    assert auto.block_sizes == files.block_sizes == [51, 51, 51, 50]
    assert max_param_diff(auto.model, files.model) == 0.0
    shuffled = train(spark, spark.read.parquet(str(root / "arrays")), replace(cfg, blocks="shuffle"))
    assert shuffled.metrics["blocks"] == "shuffle" and max_param_diff(shuffled.model, files.model) > 0
    # Validation rows are held out while Spark cuts the blocks: auto cuts them with a shuffle.
    held = train(spark, spark.read.parquet(str(root / "arrays")), replace(cfg, validation_fraction=0.2))
    assert held.metrics["blocks"] == "shuffle"


def test_unknown_blocks_value_is_refused():
    with pytest.raises(ValueError, match=r"blocks='hash' is not one of auto, shuffle, files"):
        TrainConfig(blocks="hash")  # type: ignore[arg-type]


def plan_error(path, **kwargs) -> str:
    args = {"features": "features", "label": "label", "num_workers": 2, **kwargs}
    with pytest.raises(ValueError) as err:
        plan_shards(None, str(path), **args)
    return str(err.value)


def test_driver_side_errors_name_the_cause_and_the_fix(data, tmp_path):
    root, _, _ = data
    assert "cannot read Parquet files at" in plan_error(tmp_path / "absent")
    assert "check the path" in plan_error(tmp_path / "absent")
    assert "feature column(s) ['x'] not in the Parquet files" in plan_error(root / "arrays", features="x")
    assert "label column 'y' not in the Parquet files" in plan_error(root / "arrays", label="y")
    assert "only 203 training rows for num_workers=500" in plan_error(root / "arrays", num_workers=500)
    strings = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"features": [[1.0]], "label": ["cat"]}), strings)
    assert "label column 'label' is string; it must be numeric" in plan_error(strings)
    vectors = tmp_path / "vectors.parquet"
    pq.write_table(pa.table({"features": [{"type": 1, "values": [1.0]}], "label": [0]}), vectors)
    assert "store features as array<float> or train with blocks=shuffle" in plan_error(vectors)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"features": pa.array([], pa.list_(pa.float32())), "label": pa.array([], pa.int64())}),
                   empty)
    assert "hold 0 rows" in plan_error(empty)


def test_files_missing_on_an_executor_are_a_clear_error(data, tmp_path):
    root, _, _ = data
    copy = tmp_path / "copy"
    write_files(copy, *data[1:])
    plan, _ = plan_shards(None, str(copy), features="features", label="label", num_workers=2)
    (copy / "part-00003.parquet").unlink()  # what a worker sees when the path exists on the driver only
    with pytest.raises(ValueError, match=r"part-00003.parquet on this executor .*same path on every executor"):
        read_block(plan, 1, 8)


def test_worker_side_errors_stop_every_rank_with_the_rank_named(spark, tmp_path):
    ragged = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"features": [[1.0, 2.0]] * 10 + [[1.0]] * 10, "label": [0, 1] * 10}), ragged)
    cfg = TrainConfig(num_workers=2, epochs=1, batch_size=4, model=ModelSpec(name="logreg"))
    with pytest.raises(TrainingError, match=r"ValueError: rank 1: feature arrays have lengths 1\.\.1, expected 2"):
        train_files(spark, str(ragged), cfg)
    fractional = tmp_path / "fractional.parquet"
    pq.write_table(pa.table({"features": [[1.0]] * 10, "label": [0.0, 0.5] * 5}), fractional)
    with pytest.raises(TrainingError, match=r"rank 0: 2 labels are not class indices in \[0, 2\)"):
        train_files(spark, str(fractional), cfg)
