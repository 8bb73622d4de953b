"""Bundled real data (scikit-learn's digits) and a seeded, Spark-side split and standardization."""

from __future__ import annotations

import pandas as pd
from pyspark.ml.feature import StandardScaler, StandardScalerModel, VectorAssembler
from pyspark.sql import DataFrame, SparkSession


def digits_frame(spark: SparkSession, num_partitions: int = 4) -> DataFrame:
    """scikit-learn's digits: 1,797 8x8 images, columns pixel_0..pixel_63 and `label` (0-9)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pdf = pd.DataFrame(data.data.astype("float64"), columns=[f"pixel_{i}" for i in range(64)])
    pdf["label"] = data.target.astype("int64")
    return spark.createDataFrame(pdf).repartition(num_partitions)


def split_standardized(
    df: DataFrame, feature_cols: list[str], *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[DataFrame, DataFrame, StandardScalerModel]:
    """(train, test, scaler): seeded split, then mean/std from the train split only (Spark ML)."""
    assembled = VectorAssembler(inputCols=feature_cols, outputCol="raw_features").transform(df)
    train, test = assembled.randomSplit([1.0 - test_fraction, test_fraction], seed=seed)
    scaler = StandardScaler(inputCol="raw_features", outputCol="features", withMean=True, withStd=True).fit(train)
    keep = ["features", *[c for c in df.columns if c not in feature_cols]]
    return scaler.transform(train).select(keep), scaler.transform(test).select(keep), scaler
