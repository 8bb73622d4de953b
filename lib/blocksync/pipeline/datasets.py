"""Bundled data: scikit-learn's digits, and a seeded synthetic table with categorical columns.

No package installed here ships a real tabular data set with categorical columns offline
(scikit-learn's `fetch_*` data sets download), so `shop_frame` generates one by a stated rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession


def digits_frame(spark: SparkSession, num_partitions: int = 4) -> DataFrame:
    """scikit-learn's digits: 1,797 8x8 images, columns pixel_0..pixel_63 and `label` (0-9)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pdf = pd.DataFrame(data.data.astype("float64"), columns=[f"pixel_{i}" for i in range(64)])
    pdf["label"] = data.target.astype("int64")
    return spark.createDataFrame(pdf).repartition(num_partitions)


def shop_table(rows: int = 6000, seed: int = 0) -> pd.DataFrame:
    """A seeded table of store-days: `store` (categorical, 0..39), `weekday` (categorical, 0..6), `price`
    and `discount` (numeric), and `label`: whether sales were low (0), usual (1) or high (2).

    The rule: each store and each weekday has its own effect, drawn once from N(0, 1) with `seed`; a
    day's score is store effect + weekday effect - 0.8 * price + 1.5 * discount + N(0, 0.3) noise, and
    the label is the score's tercile. The store and weekday effects are arbitrary per code, so a
    model reading the codes as numbers cannot learn them; one embedding per code can.
    """
    rng = np.random.default_rng(seed)
    store_effect, weekday_effect = rng.normal(0, 1, 40), rng.normal(0, 1, 7)
    store, weekday = rng.integers(0, 40, rows), rng.integers(0, 7, rows)
    price, discount = rng.normal(0, 1, rows), rng.uniform(0, 1, rows)
    score = store_effect[store] + weekday_effect[weekday] - 0.8 * price + 1.5 * discount + rng.normal(0, 0.3, rows)
    label = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    return pd.DataFrame({"store": store.astype("int64"), "weekday": weekday.astype("int64"),
                         "price": price, "discount": discount, "label": label.astype("int64")})


def shop_frame(spark: SparkSession, rows: int = 6000, seed: int = 0, num_partitions: int = 4) -> DataFrame:
    """`shop_table` as a Spark DataFrame."""
    return spark.createDataFrame(shop_table(rows, seed)).repartition(num_partitions)
