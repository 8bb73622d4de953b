"""The `prepare` stage: features and label, seeded split, standardization from Spark aggregates.

Output (under `<run>/prepared/`): `train.parquet` and `test.parquet` with
`features` (array<float>) and `label` (class index, or the target), written by
Spark; the stage adds `prepare.json` with the metadata `prepare` returns: the
feature columns, the train-split mean and standard deviation, and the label
mapping. The same metadata goes into the model's model.json, so a saved model
can score raw features.
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.functions import array_to_vector
from pyspark.ml.stat import Summarizer
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blocksync.engine.driver.blocks import (
    FEATURES,
    LABEL,
    WEIGHT,
    bad_weight_flag,
    check_label_not_a_feature,
    check_label_not_an_input,
    features_column,
    weight_column,
)
from blocksync.engine.driver.input_columns import resolve_inputs
from blocksync.engine.inputs import source_columns, total_weight_problem
from blocksync.pipeline.run_config import RunConfig
from blocksync.pipeline.sources import load_source

MAX_CLASSES = 1000


def resolve_feature_columns(df: DataFrame, features: list[str] | str | None, label: str,
                            weight: str | None = None) -> list[str] | str:
    if features is None:
        cols = [c for c in df.columns if c not in (label, weight)]
        return cols[0] if len(cols) == 1 else cols
    return features


def no_rows(source: str) -> ValueError:
    return ValueError(f"data.source={source!r} has no rows; check the path, table or filter.")


def label_mapping(df: DataFrame, label: str, task: str, source: str) -> list[Any] | None:
    """Sorted distinct class values (index = position) for classification; None for regression.
    Classification data without rows is refused here (its distinct labels are the first query)."""
    if label not in df.columns:
        raise ValueError(f"label column {label!r} not in the data (columns: {sorted(df.columns)}); set data.label.")
    dtype = df.schema[label].dataType
    if task == "regression":
        if not isinstance(dtype, T.NumericType):
            raise ValueError(f"label column {label!r} is {dtype.simpleString()}; regression needs numbers.")
        return None
    values = [r[0] for r in df.select(label).distinct().limit(MAX_CLASSES + 1).collect()]
    if not values:
        raise no_rows(source)
    if None in values:
        raise ValueError(f"label column {label!r} has nulls; drop or fill them before training.")
    if len(values) > MAX_CLASSES:
        raise ValueError(f"label column {label!r} has more than {MAX_CLASSES} classes; is task=regression meant?")
    if len(values) < 2:
        raise ValueError(f"label column {label!r} has {len(values)} class(es); classification needs at least 2.")
    return sorted(values)


def screen_invalid_rows(df: DataFrame, policy: str) -> tuple[DataFrame, int, int]:
    """Rows with a null, NaN or infinite feature: fail with their count, or drop them and report it.
    Returns (the rows kept, how many were dropped, how many are kept).

    The same pass checks that every row has as many features as the others.
    """
    bad = (
        F.col(FEATURES).isNull()
        | F.exists(F.col(FEATURES), lambda v: v.isNull() | F.isnan(v) | (F.abs(v) == F.lit(float("inf"))))
    )
    flagged = df.withColumn("_bad", bad)
    width = F.when(F.col(FEATURES).isNotNull(), F.size(FEATURES))
    facts = flagged.agg(F.sum(F.col("_bad").cast("long")).alias("bad"), F.min(width).alias("lo"),
                        F.max(width).alias("hi"), F.count(F.lit(1)).alias("rows")).collect()[0]
    count = int(facts["bad"] or 0)
    if facts["lo"] != facts["hi"]:
        raise ValueError(
            f"feature arrays have differing lengths ({facts['lo']} to {facts['hi']} values); every row needs "
            "the same number of features: fix the data, or name equal-length columns in data.features."
        )
    if count and policy == "fail":
        raise ValueError(
            f"{count} rows have null, NaN or infinite features; clean them, or set data.invalid_rows=drop "
            "to drop them (the count is reported)."
        )
    kept = int(facts["rows"]) - count
    return (flagged.filter(~F.col("_bad")).drop("_bad"), count, kept) if count else (df, 0, kept)


def standardization(train: DataFrame) -> tuple[list[float], list[float], int]:
    """Per-feature mean and standard deviation of the train split, and its row count (one Spark ML
    Summarizer pass)."""
    row = (
        train.select(array_to_vector(F.col(FEATURES)).alias("v"))
        .select(Summarizer.metrics("mean", "std", "count").summary(F.col("v")).alias("s"))
        .collect()[0]["s"]
    )
    mean = [float(v) for v in row["mean"].toArray()]
    std = [float(v) if v > 0 else 1.0 for v in row["std"].toArray()]  # constant features stay as they are
    return mean, std, int(row["count"])


def standardized(features: Column, mean: list[float], std: list[float]) -> Column:
    """(x - mean) / std per element, in double, as array<float>: prepare's and predict's one formula."""
    m = F.array(*[F.lit(v) for v in mean])
    s = F.array(*[F.lit(v) for v in std])
    scaled = F.transform(features, lambda x, i: (x - F.element_at(m, i + 1)) / F.element_at(s, i + 1))
    return scaled.cast("array<float>")


def apply_standardization(df: DataFrame, mean: list[float], std: list[float]) -> DataFrame:
    return df.withColumn(FEATURES, standardized(F.col(FEATURES), mean, std))


def checked_weights(df: DataFrame, weight: str) -> Column:
    """data.weight as float64, after one pass that refuses null, NaN, infinite or negative weights."""
    try:
        column = weight_column(df, weight)
    except ValueError as err:
        raise ValueError(f"data.weight: {err}") from err
    bad, total = df.select(column.alias(WEIGHT)).agg(F.sum(bad_weight_flag()), F.sum(WEIGHT)).collect()[0]
    if bad:
        raise ValueError(f"data.weight={weight!r}: {bad} rows have a null, NaN, infinite or negative weight; "
                         "row weights must be finite numbers >= 0: fix or drop those rows.")
    problem = total_weight_problem(float(total or 0.0), f"data.weight={weight!r}", rows="all rows")
    if problem:  # the training split alone is checked again when training starts
        raise ValueError(problem + ".")
    return column


def prepare(spark: SparkSession, config: RunConfig, out: str) -> dict[str, Any]:
    """Write `{train,test}.parquet` into the folder `out` (a path or URI); return the metadata."""
    data, task = config.data, config.train.task
    raw = load_source(spark, data, task)
    labels = label_mapping(raw, data.label, task, data.source)
    if data.inputs is not None:
        return prepare_typed(raw, config, out, labels)
    feature_cols = resolve_feature_columns(raw, data.features, data.label, data.weight)
    check_label_not_a_feature(feature_cols, data.label)
    weights = [checked_weights(raw, data.weight).alias(WEIGHT)] if data.weight else []
    label = label_index(data.label, labels)
    assembled = raw.select(features_column(raw, feature_cols).alias(FEATURES), label.alias(LABEL), *weights)
    assembled, dropped, kept = screen_invalid_rows(assembled, data.invalid_rows)
    if not kept:
        raise no_rows(data.source) if not dropped else ValueError(
            f"all {dropped} rows of data.source={data.source!r} have null, NaN or infinite features and "
            "data.invalid_rows=drop dropped them: nothing is left to train on; clean the data.")
    train, test = assembled.randomSplit([1.0 - data.test_fraction, data.test_fraction], seed=data.seed)
    mean: list[float] | None = None
    std: list[float] | None = None
    if data.standardize:
        # The split is seeded and deterministic, so the rows summarized are the rows written.
        mean, std, train_rows = standardization(train)
        train, test = apply_standardization(train, mean, std), apply_standardization(test, mean, std)
    train.write.mode("overwrite").parquet(f"{out}/train.parquet")
    test.write.mode("overwrite").parquet(f"{out}/test.parquet")
    if not data.standardize:
        train_rows = spark.read.parquet(f"{out}/train.parquet").count()
    counts = {"train": train_rows, "test": kept - train_rows}
    meta = {
        "source": data.source,
        "task": task,
        "feature_columns": feature_cols,
        "label_column": data.label,
        "weight_column": data.weight,
        "labels": labels,
        "mean": mean,
        "std": std,
        "rows": counts,
        "dropped_invalid_rows": dropped,
    }
    return meta


def label_index(label: str, labels: list[Any] | None) -> Column:
    """The label as a double: the class's index in `labels` (classification), or the value (regression)."""
    if labels is None:
        return F.col(label).cast("double")
    return (F.array_position(F.array(*[F.lit(v) for v in labels]), F.col(label)) - 1).cast("double")


def prepare_typed(raw: DataFrame, config: RunConfig, out: str, labels: list[Any] | None) -> dict[str, Any]:
    """`data.inputs`: the inputs are checked and their cardinalities measured over all rows (so a category
    the test split holds is known); the split keeps their source columns as they are, with `label`."""
    data = config.data
    try:
        spec = resolve_inputs(raw, data.inputs or [])
    except ValueError as err:
        raise ValueError(f"data.inputs: {err}") from err
    check_label_not_an_input(raw, spec, data.label)
    sources = list(dict.fromkeys(c for item in spec.inputs for c in source_columns(item, raw.columns)))
    weights = [checked_weights(raw, data.weight).alias(WEIGHT)] if data.weight else []
    table = raw.select(*sources, label_index(data.label, labels).alias(LABEL), *weights)
    train, test = table.randomSplit([1.0 - data.test_fraction, data.test_fraction], seed=data.seed)
    train.write.mode("overwrite").parquet(f"{out}/train.parquet")
    test.write.mode("overwrite").parquet(f"{out}/test.parquet")
    spark = raw.sparkSession
    counts = {name: spark.read.parquet(f"{out}/{name}.parquet").count() for name in ("train", "test")}
    meta = {"source": data.source, "task": config.train.task, "feature_columns": None, "inputs": spec.to_dicts(),
            "label_column": data.label, "weight_column": data.weight, "labels": labels, "mean": None, "std": None,
            "rows": counts, "dropped_invalid_rows": 0}
    return meta
