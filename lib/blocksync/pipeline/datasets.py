"""Bundled real data: scikit-learn's digits as a Spark DataFrame."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, SparkSession


def digits_frame(spark: SparkSession, num_partitions: int = 4) -> DataFrame:
    """scikit-learn's digits: 1,797 8x8 images, columns pixel_0..pixel_63 and `label` (0-9)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pdf = pd.DataFrame(data.data.astype("float64"), columns=[f"pixel_{i}" for i in range(64)])
    pdf["label"] = data.target.astype("int64")
    return spark.createDataFrame(pdf).repartition(num_partitions)
