"""Where the data comes from: bundled digits, seeded synthetic data, or a user's Parquet/CSV/table."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blocksync.pipeline.datasets import digits_frame
from blocksync.pipeline.run_config import DataSettings, SyntheticSettings


def synthetic_frame(spark: SparkSession, settings: SyntheticSettings, task: str, seed: int) -> DataFrame:
    """Seeded data generated on the executors: `features` array<float> and `label`.

    Features are standard normal; labels come from a fixed random linear map
    (drawn on the driver from `seed`) plus Gaussian noise: argmax over classes
    for classification, the value itself for regression. Deterministic for a
    given seed and partition count.
    """
    rng = np.random.default_rng(seed)
    outputs = settings.classes if task == "classification" else 1
    weights = rng.normal(0.0, 1.0 / np.sqrt(settings.features), size=(settings.features, outputs))
    base = spark.range(settings.rows, numPartitions=settings.partitions)
    feats = [F.randn(seed * 7919 + j) for j in range(settings.features)]
    df = base.select(F.array(*feats).alias("x"))
    signal = [
        F.aggregate(
            F.zip_with(F.col("x"), F.array(*[F.lit(float(w)) for w in weights[:, c]]), lambda a, b: a * b),
            F.lit(0.0), lambda acc, v: acc + v,
        ) + F.lit(settings.noise) * F.randn(seed * 7919 + settings.features + c)
        for c in range(outputs)
    ]
    if task == "classification":
        scores = F.array(*signal)
        label = (F.array_position(scores, F.array_max(scores)) - 1).cast("long")
    else:
        label = signal[0]
    return df.select(F.col("x").cast("array<float>").alias("features"), label.alias("label"))


def load_source(spark: SparkSession, data: DataSettings, task: str) -> DataFrame:
    """The raw input DataFrame named by `data.source`."""
    source = data.source
    if source == "digits":
        return digits_frame(spark)
    if source == "synthetic":
        return synthetic_frame(spark, data.synthetic, task, data.seed)
    return read_path_or_table(spark, source, data.format, setting="data.source")


def read_path_or_table(spark: SparkSession, source: str, fmt: str, *, setting: str) -> DataFrame:
    """A table name, or Parquet/CSV files at a path or URI (`fmt` auto: by the name); `setting` names it in errors."""
    uri = is_uri(source)
    looks_like_path = "/" in source or uri or Path(source).suffix in (".parquet", ".csv")
    if fmt == "auto":
        fmt = ("csv" if source.endswith(".csv") else "parquet") if looks_like_path else "table"
    if fmt == "table":
        if not spark.catalog.tableExists(source):
            raise ValueError(
                f"{setting}={source!r}: no such table (and not a path); give an existing table name, "
                "a Parquet/CSV path" + (", digits or synthetic." if setting == "data.source" else ".")
            )
        return spark.table(source)
    # No driver-side existence check: a scheme-less path is resolved by Spark's default filesystem
    # (fs.defaultFS: HDFS on many clusters), which only Spark knows; a missing path fails at once below.
    try:
        if fmt == "csv":
            return spark.read.option("header", True).option("inferSchema", True).csv(source)
        return spark.read.parquet(source)
    except AnalysisException as err:
        if "UNABLE_TO_INFER_SCHEMA" in str(err.getCondition()):
            raise ValueError(
                f"{setting}={source!r} holds no {fmt} files (an empty folder?); point it at the data files."
            ) from err
        if "PATH_NOT_FOUND" in str(err.getCondition()):
            raise ValueError(f"{setting}={source!r} does not exist; check the path.") from err
        raise


def is_uri(path: str) -> bool:
    """`s3://b/k`, `hdfs://nn/p`, `dbfs:/p`, `file:/p`: a scheme that Spark's filesystems resolve."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", path) is not None
