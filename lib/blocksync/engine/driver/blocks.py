"""Driver side: cut a training DataFrame into exactly `num_workers` balanced blocks.

The result has one partition per worker, partition i being block i, with the
columns `features` (array<float>) and `label` (double), and where asked `ids`
(typed inputs' id columns, array<long>), `weight` (per-row weights) and `_val`
(held-out validation rows, placed after each block's training rows).
Assignment is a pure function of each row's content and the seed, so it does
not depend on how the input happened to be partitioned.

The assignment, step by step: `make_blocks`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from blocksync.engine.driver.input_columns import NUMERIC as _NUMERIC
from blocksync.engine.driver.input_columns import is_vector as _is_vector
from blocksync.engine.driver.input_columns import packed_columns
from blocksync.engine.inputs import FEATURES, IDS, LABEL, WEIGHT, InputSpec, source_columns, total_weight_problem

"""With per-row weights: the blocks' third column (float64, checked finite and non-negative)."""


@dataclass(frozen=True)
class BlockInfo:
    """What the driver knows about the blocks before launch."""

    num_features: int
    sizes: list[int]
    labels: tuple[float, float, int] | None = None
    """(min, max, number of non-integer labels), when `make_blocks` counted them on its
    pass over the data; None makes the launcher scan the blocks for them."""
    val_sizes: list[int] | None = None
    """Held-out validation rows per block, which follow its `sizes` training rows in the
    partition; None: no validation."""
    inputs: InputSpec | None = None
    """Typed inputs (`num_features` is then the width of the numeric ones); None: one feature matrix."""


def _names(features: str | list[str]) -> list[str]:
    return [features] if isinstance(features, str) else list(features)


def check_label_not_an_input(df: DataFrame, inputs: InputSpec, label: str) -> None:
    """The label read by an input would leak the answer into the inputs."""
    for item in inputs.inputs:
        if label in source_columns(item, df.columns):
            raise ValueError(f"the label column {label!r} is also read by inputs[{item.name!r}]; remove it from "
                             "that input, or the model would read the answer.")


def check_label_not_a_feature(features: str | list[str], label: str) -> None:
    """The label among the features would leak the answer into the inputs."""
    names = _names(features)
    if label in names:
        raise ValueError(
            f"the label column {label!r} is also listed among the features {names}; "
            "remove it from the features (data.features), or the model would read the answer."
        )


# The checks and messages below serve both block sources: Spark types here (`make_blocks`),
# Arrow types in shards.py (`plan_shards`). `where` names what was searched ("the DataFrame").

def feature_names(features: str | list[str], columns: Collection[str], where: str, single: str) -> list[str]:
    """`features` as a list of names, each one of `columns`; `single` names the one-column forms accepted."""
    names = _names(features)
    if not names:
        raise ValueError(f"no feature columns given; name {single} or a list of numeric columns.")
    missing = [n for n in names if n not in columns]
    if missing:
        raise ValueError(
            f"feature column(s) {missing} not in {where} (columns: {sorted(columns)}); "
            "fix the feature column names."
        )
    return names


def array_not_numeric(name: str, kind: str) -> ValueError:
    """A single array feature column of `kind` (its type, described) whose elements are not numbers."""
    return ValueError(f"feature column {name!r} is {kind}; it must hold numbers.")


def features_not_numeric(bad: dict[str, str], detail: str) -> ValueError:
    """Feature columns (name: type) that are not numbers; `detail` ends the sentence."""
    return ValueError(f"feature column(s) {bad} are not numeric; cast or encode them first{detail}")


def check_label(label: str, columns: Collection[str], where: str) -> None:
    if label not in columns:
        raise ValueError(
            f"label column {label!r} not in {where} (columns: {sorted(columns)}); fix the label column name."
        )


def label_not_numeric(label: str, kind: str) -> ValueError:
    return ValueError(
        f"label column {label!r} is {kind}; it must be numeric "
        "(map string classes to indices first, e.g. with pyspark.ml.feature.StringIndexer)."
    )


def check_enough_rows(total: int, num_workers: int) -> None:
    if total < num_workers:
        raise ValueError(
            f"only {total} training rows for num_workers={num_workers}; every block needs rows. "
            "Lower num_workers or add data."
        )


def features_column(df: DataFrame, features: str | list[str]) -> Column:
    """`features` as array<float>, from an array column, an ML vector column or numeric columns."""
    schema = {f.name: f.dataType for f in df.schema.fields}
    names = feature_names(features, schema, "the DataFrame", "an array/vector column")
    if len(names) == 1:
        dtype = schema[names[0]]
        if isinstance(dtype, T.ArrayType):
            if not isinstance(dtype.elementType, _NUMERIC):
                raise array_not_numeric(names[0], f"array<{dtype.elementType.simpleString()}>")
            return F.col(names[0]).cast("array<float>")
        if _is_vector(dtype):
            from pyspark.ml.functions import vector_to_array

            return vector_to_array(F.col(names[0]), "float32")
    bad = {n: schema[n].simpleString() for n in names if not isinstance(schema[n], _NUMERIC)}
    if bad:
        raise features_not_numeric(bad, " (features must be numbers, an array of numbers or an ML vector).")
    return F.array(*[F.col(n).cast("float") for n in names])


def label_column(df: DataFrame, label: str) -> Column:
    schema = {f.name: f.dataType for f in df.schema.fields}
    check_label(label, schema, "the DataFrame")
    if not isinstance(schema[label], _NUMERIC):
        raise label_not_numeric(label, schema[label].simpleString())
    return F.col(label).cast("double")


def partition_keys(spark: SparkSession, num_partitions: int) -> list[int]:
    """For each partition i, a long whose hash partitioning sends it to partition i.

    `repartition(n, col)` places a row in `pmod(murmur3(col, 42), n)`, which is
    exactly SQL `pmod(hash(col), n)`; we search small longs for one per partition.
    """
    limit = 64 * num_partitions + 1024
    rows = (
        spark.range(limit)
        .select("id", F.expr(f"pmod(hash(id), {num_partitions})").alias("p"))
        .groupBy("p")
        .agg(F.min("id").alias("id"))
        .collect()
    )
    found = {int(r["p"]): int(r["id"]) for r in rows}
    if len(found) < num_partitions:
        raise RuntimeError(f"no partitioning key found for all {num_partitions} partitions")
    return [found[i] for i in range(num_partitions)]


def label_aggregates() -> list[Column]:
    """Aggregates behind `label_facts`: min and max label, and the count of non-integer labels."""
    return [
        F.min(LABEL).alias("lo"), F.max(LABEL).alias("hi"),
        F.sum(F.when(F.col(LABEL) != F.floor(F.col(LABEL)), 1).otherwise(0)).alias("fractional"),
    ]


def label_facts(rows: list) -> tuple[float, float, int]:
    """(min, max, non-integer count) over rows of `label_aggregates` (one row, or one per group)."""
    return (min(float(r["lo"]) for r in rows), max(float(r["hi"]) for r in rows),
            sum(int(r["fractional"] or 0) for r in rows))


def validation_flag(df: DataFrame, column: str | None) -> Column:
    """`column` as the held-out flag (a boolean, or 0/1 numbers), checked; no column: nothing held out."""
    if column is None:
        return F.lit(False)
    schema = {f.name: f.dataType for f in df.schema.fields}
    if column not in schema:
        raise ValueError(f"validation column {column!r} not in the DataFrame (columns: {sorted(schema)}); "
                         "name a boolean column that marks the held-out rows.")
    if not isinstance(schema[column], (T.BooleanType, *_NUMERIC)):
        raise ValueError(f"validation column {column!r} is {schema[column].simpleString()}; it must be "
                         "boolean (true: a held-out validation row).")
    return F.col(column).cast("boolean")


def make_blocks(
    df: DataFrame,
    *,
    features: str | list[str] = FEATURES,
    label: str,
    num_workers: int,
    seed: int,
    validation_col: str | None = None,
    validation_fraction: float = 0.0,
    weight: str | None = None,
    inputs: InputSpec | None = None,
    cut: Callable[[int, tuple | None, InputSpec | None, int], list[int] | None] | None = None,
) -> tuple[DataFrame, BlockInfo]:
    """Return (blocks DataFrame with exactly `num_workers` partitions, BlockInfo).

    With `inputs` (resolved by `input_columns.resolve_inputs`; `features` is then unused), the blocks
    carry the numeric inputs packed in `features` and the id inputs in `ids` (see `inputs`).

    With validation (rows flagged by `validation_col`, or a seeded content-hashed
    `validation_fraction`), held-out rows are balanced over the blocks on their
    own and placed after each block's training rows. `weight` names a numeric column of per-row
    weights, carried as the blocks' `weight` column and checked here (finite, >= 0).

    1. `key = xxhash64(seed, features, ids, label)` (`ids` only with typed inputs); rows are spread over `B`
       hash buckets.
    2. Per bucket, rows are numbered in key order (a window per bucket, so no single
       partition holds all data); bucket sizes are collected to the driver (B numbers).
    3. `block = (rows in earlier buckets + number within bucket) mod N`: round robin
       over a seeded permutation, so block sizes differ by at most one. With `cut` (balance=speed:
       called with the feature width, label facts, inputs and training row count, it returns the
       block sizes, or None to keep this even cut), training row g of that same order goes to the
       block whose contiguous range [sizes[0] + ... + sizes[b-1], ... + sizes[b]) holds g; held-out
       rows stay round robin.
    4. Each block id is mapped to a partitioning key whose Murmur3 hash lands in the
       partition of the same index (found once on the driver with Spark's own
       `hash`), then `repartition(N, key)` puts block i in partition i exactly.

    Only DataFrame operations are used, so this also runs on Spark Connect.
    """
    data = _block_columns(df, features, label, validation_col, weight, inputs)
    content = [F.col(c.name) for c in data.schema.fields if c.name in (FEATURES, IDS, LABEL)]
    if validation_fraction > 0:
        share = F.pmod(F.xxhash64(F.lit(seed + 1), *content), F.lit(1_000_000))
        data = data.withColumn("_val", share < F.lit(int(validation_fraction * 1_000_000)))

    key = F.xxhash64(F.lit(seed), *content)
    num_buckets = max(4 * num_workers, 16)
    keyed = data.withColumn("_key", key).withColumn("_bucket", F.pmod(F.col("_key"), F.lit(num_buckets)))
    stats = _bucket_stats(keyed, weight)
    num_features = _check_stats(stats) if inputs is None else _check_rows(stats, inputs.float_width)
    _check_weights(stats, weight)
    validating = validation_col is not None or validation_fraction > 0
    totals = _check_totals(stats, num_workers, validating, validation_col, validation_fraction)
    sizes = {held: _balanced(totals[held], num_workers) for held in (False, True)}
    weighted = cut(num_features, label_facts(stats), inputs, totals[False]) if cut is not None else None
    if weighted is not None:  # None: the even cut, exactly as without `cut`
        sizes[False] = weighted
    blocks = _assign_blocks(keyed, stats, num_buckets, num_workers, weight, weighted)
    return blocks, BlockInfo(num_features=num_features, sizes=sizes[False], labels=label_facts(stats),
                             val_sizes=sizes[True] if validating else None, inputs=inputs)


def _block_columns(df: DataFrame, features: str | list[str], label: str, validation_col: str | None,
                   weight: str | None, inputs: InputSpec | None) -> DataFrame:
    """The columns a block carries, checked: features (or packed inputs), label, validation flag, weight."""
    weights = [weight_column(df, weight).alias(WEIGHT)] if weight else []
    if inputs is None:
        check_label_not_a_feature(features, label)
        values = [features_column(df, features).alias(FEATURES)]
    else:

        check_label_not_an_input(df, inputs, label)
        floats, ids = packed_columns(df, inputs)
        values = [floats.alias(FEATURES), ids.alias(IDS)]
    return df.select(*values, label_column(df, label).alias(LABEL), validation_flag(df, validation_col).alias("_val"),
                     *weights)


def _bucket_stats(keyed: DataFrame, weight: str | None) -> list:
    """One aggregate pass: per (held out, bucket), the row count and what the checks need."""
    return keyed.groupBy("_val", "_bucket").agg(
        F.count(F.lit(1)).alias("n"),
        F.min(F.size(FEATURES)).alias("dmin"),
        F.max(F.size(FEATURES)).alias("dmax"),
        F.sum(F.when(F.col(LABEL).isNull(), 1).otherwise(0)).alias("null_labels"),
        F.sum(bad_weight_flag() if weight else F.lit(0)).alias("bad_weights"),
        F.sum(F.col(WEIGHT) if weight else F.lit(0.0)).alias("weight_sum"),
        *label_aggregates(),
    ).collect()


def _check_totals(stats: list, num_workers: int, validating: bool, validation_col: str | None,
                  validation_fraction: float) -> dict[bool, int]:
    """Rows for training (False) and held out (True); refuses too few of either."""
    totals = {held: sum(int(r["n"]) for r in stats if r["_val"] is held) for held in (False, True)}
    if any(r["_val"] is None for r in stats):
        raise ValueError(f"validation column {validation_col!r} has nulls; mark every row true or false.")
    check_enough_rows(totals[False], num_workers)
    if validating and not totals[True]:
        where = (f"validation column {validation_col!r}" if validation_col
                 else f"validation_fraction={validation_fraction:g}")
        raise ValueError(f"{where} holds out no rows; mark some rows true, or raise the fraction.")
    return totals


def _assign_blocks(keyed: DataFrame, stats: list, num_buckets: int, num_workers: int,
                   weight: str | None, sizes: list[int] | None = None) -> DataFrame:
    """Deal each set's rows round-robin over the blocks, bucket after bucket in key order, and place them;
    with `sizes`, training rows go in contiguous ranges of that order instead."""
    offsets = {held: _bucket_offsets(stats, held, num_buckets) for held in (False, True)}
    tie_break = [*(c for c in (FEATURES, IDS) if c in keyed.columns), LABEL, *([WEIGHT] if weight else [])]
    index_in_bucket = F.row_number().over(Window.partitionBy("_val", "_bucket").orderBy("_key", *tie_break)) - 1
    bucket = F.col("_bucket").cast("int") + 1
    bucket_offset = F.when(F.col("_val"), F.element_at(F.array(*[F.lit(o) for o in offsets[True]]), bucket)).otherwise(
        F.element_at(F.array(*[F.lit(o) for o in offsets[False]]), bucket))
    position = bucket_offset + index_in_bucket
    block = F.pmod(position, F.lit(num_workers))
    if sizes is not None:
        starts = [sum(sizes[:b]) for b in range(1, num_workers)]
        ranged = sum((F.when(position >= F.lit(s), 1).otherwise(0) for s in starts), F.lit(0))
        block = F.when(F.col("_val"), block).otherwise(ranged)
    assigned = keyed.withColumn("_block", block)
    return place_blocks(assigned, block="_block", order=["_val", "_key", *tie_break], num_workers=num_workers)


def _balanced(total: int, num_workers: int) -> list[int]:
    return [total // num_workers + (1 if i < total % num_workers else 0) for i in range(num_workers)]


def _bucket_offsets(stats: list, held: bool, num_buckets: int) -> list[int]:
    """Rows of the flagged (or unflagged) set before each bucket: where its rows start in the round-robin."""
    counts = {int(r["_bucket"]): int(r["n"]) for r in stats if r["_val"] is held}
    offsets, running = [], 0
    for b in range(num_buckets):
        offsets.append(running)
        running += counts.get(b, 0)
    return offsets


def _check_rows(stats: list, num_features: int) -> int:
    """`num_features`, after checking the data has rows and no null labels (typed inputs: their widths
    were checked by `resolve_inputs`)."""
    if sum(int(r["n"]) for r in stats) == 0:
        raise ValueError("the training data is empty (0 rows); check the input path, table or filter.")
    null_labels = sum(int(r["null_labels"]) for r in stats)
    if null_labels:
        raise ValueError(f"{null_labels} rows have a null label; drop or fill them before training.")
    return num_features


def _check_stats(stats: list) -> int:
    """The feature width every row shares; raises on empty data, ragged or empty features, null labels."""
    _check_rows(stats, 0)
    dims = {int(r["dmin"]) for r in stats} | {int(r["dmax"]) for r in stats}
    if len(dims) != 1 or -1 in dims:
        raise ValueError(
            f"feature arrays have differing lengths {sorted(dims)} (or nulls); "
            "every row needs the same number of features."
        )
    num_features = dims.pop()
    if num_features == 0:
        raise ValueError("feature arrays are empty; every row needs at least one feature.")
    return num_features


def weight_column(df: DataFrame, weight: str) -> Column:
    """`weight` as float64, or a ValueError naming the column and what it must be."""
    schema = {f.name: f.dataType for f in df.schema.fields}
    if weight not in schema:
        raise ValueError(f"weight column {weight!r} not in the DataFrame (columns: {sorted(schema)}); name a "
                         "numeric column of per-row weights, or leave the weight unset.")
    if not isinstance(schema[weight], _NUMERIC):
        raise ValueError(f"weight column {weight!r} is {schema[weight].simpleString()}; row weights must be "
                         "numbers >= 0.")
    return F.col(weight).cast("double")


def bad_weight_flag() -> Column:
    """1 for a row whose weight is null, NaN, infinite or negative, else 0."""
    w = F.col(WEIGHT)
    return F.when(w.isNull() | F.isnan(w) | (F.abs(w) == F.lit(float("inf"))) | (w < 0), 1).otherwise(0)


def _check_weights(stats: list, weight: str | None) -> None:
    bad = sum(int(r["bad_weights"] or 0) for r in stats)
    if weight and bad:
        raise ValueError(f"{bad} rows have a null, NaN, infinite or negative weight in column {weight!r}; "
                         "row weights must be finite numbers >= 0: fix or drop those rows.")
    total = sum(float(r["weight_sum"] or 0.0) for r in stats if r["_val"] is False)
    problem = total_weight_problem(total, f"weight column {weight!r}") if weight else None
    if problem:
        raise ValueError(problem + ".")


def place_blocks(df: DataFrame, *, block: str, order: list[str], num_workers: int) -> DataFrame:
    """Put rows whose `block` column is i into partition i (exactly), sorted by `order` inside it."""
    keys = partition_keys(df.sparkSession, num_workers)
    part_key = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col(block).cast("int") + 1)
    return (
        df.withColumn("_pkey", part_key.cast("long"))
        .repartition(num_workers, "_pkey")
        .sortWithinPartitions(*order)
        .select(FEATURES, *([IDS] if IDS in df.columns else []), LABEL, *([WEIGHT] if WEIGHT in df.columns else []))
    )
