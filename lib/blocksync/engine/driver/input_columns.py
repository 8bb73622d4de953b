"""Driver side of typed inputs (`inputs`): read each input's columns, measure and check them in one Spark
aggregate, and pack them into the blocks' `features` (array<float>) and `ids` (array<bigint>) columns.

`resolve_inputs` is the one pass: null values, arrays of ragged length, non-integer ids, negative ids
and ids at or beyond a given cardinality are refused with one line naming the input; unset widths
and cardinalities are measured. `check_ids` runs the same pass on data to score against a trained
model's cardinalities (an unseen category is an error: see `inputs`). Only DataFrame operations, so
this runs on Spark Connect too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blocksync.engine.inputs import Input, InputSpec, parse_inputs, source_columns, with_measured

NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)
"""Spark types a numeric feature, label or weight column may have."""


def is_vector(dtype: T.DataType) -> bool:
    return dtype.typeName() == "vector" or type(dtype).__name__ == "VectorUDT"


def values_column(df: DataFrame, item: Input) -> Column:
    """`item`'s values as they are stored: numeric array<float>; tokens array<bigint>; categorical bigint.
    Ids are cast from the source's numbers straight to int64 (after `resolve_inputs` checked they are
    integers), never through float32."""
    raw = _raw(df, item)
    if item.kind == "numeric":
        return raw.cast("array<float>")
    return raw.cast("array<bigint>" if item.kind == "tokens" else "bigint")


def _raw(df: DataFrame, item: Input) -> Column:
    """The source values: an array column (or vector) as is, several columns as an array, one column as is
    (categorical) or as a one-element array."""
    schema = {f.name: f.dataType for f in df.schema.fields}
    names = source_columns(item, schema)
    where = f"inputs[{item.name!r}]"
    dtype = schema[names[0]]
    if len(names) == 1 and isinstance(dtype, T.ArrayType):
        element = dtype.elementType
        if item.kind == "categorical" or not isinstance(element, NUMERIC):
            raise ValueError(f"{where} reads {names[0]!r}, an {schema[names[0]].simpleString()}; "
                             + ("a categorical input is one integer column." if item.kind == "categorical"
                                else "its values must be numbers."))
        return F.col(names[0])
    if len(names) == 1 and is_vector(schema[names[0]]) and item.kind == "numeric":
        from pyspark.ml.functions import vector_to_array

        return vector_to_array(F.col(names[0]), "float32")
    bad = {n: schema[n].simpleString() for n in names if not isinstance(schema[n], NUMERIC)}
    if bad:
        hint = (" (index strings first, e.g. with pyspark.ml.feature.StringIndexer)" if item.is_ids else
                " (cast or encode them first)")
        raise ValueError(f"{where} reads column(s) {bad}, which are not numeric{hint}.")
    if item.kind == "categorical":
        return F.col(names[0])
    return F.array(*[F.col(n) for n in names])


def _aggregates(df: DataFrame, n: int, item: Input) -> list[Column]:
    raw = _raw(df, item)
    values = F.array(raw) if item.kind == "categorical" else raw
    has_null = raw.isNull() | F.exists(values, lambda v: v.isNull())
    out = [F.sum(has_null.cast("long")).alias(f"null{n}"),
           F.min(F.size(values)).alias(f"lo{n}"), F.max(F.size(values)).alias(f"hi{n}")]
    if item.is_ids:
        fractional = F.exists(values, lambda v: v != F.floor(v))
        out += [F.min(F.array_min(values)).alias(f"min{n}"), F.max(F.array_max(values)).alias(f"max{n}"),
                F.sum(fractional.cast("long")).alias(f"frac{n}")]
    return out


def _checked(row: Any, n: int, item: Input, scoring: bool) -> Input:
    """`item` measured from its aggregates in `row`, or a ValueError naming the input and the fix."""
    where = f"inputs[{item.name!r}]"
    if row[f"null{n}"]:
        raise ValueError(f"{where}: {row[f'null{n}']} rows are null or hold nulls; drop or fill them first.")
    lo, hi = int(row[f"lo{n}"]), int(row[f"hi{n}"])
    if lo != hi:
        raise ValueError(f"{where}: arrays of ragged length ({lo} to {hi} values); every row needs the same "
                         "length: pad them to one length" + (" (and set its pad id)." if item.kind == "tokens"
                                                             else "."))
    if scoring and hi != item.width:
        raise ValueError(f"{where} has {hi} values a row; the model was trained on {item.width}.")
    if hi == 0:
        raise ValueError(f"{where}: the arrays are empty; every row needs at least one value.")
    if not item.is_ids:
        return with_measured(item, hi, None)
    if row[f"frac{n}"]:
        raise ValueError(f"{where}: {row[f'frac{n}']} rows hold non-integer values; {item.kind} ids are integers "
                         "0..cardinality-1.")
    smallest, largest = int(row[f"min{n}"]), int(row[f"max{n}"])
    what = "token id" if item.kind == "tokens" else "category"
    if smallest < 0:
        raise ValueError(f"{where}: {what} {smallest} is negative; ids are integers 0..cardinality-1.")
    if item.cardinality is not None and largest >= item.cardinality:
        if item.kind == "tokens":
            raise ValueError(f"{where}: token id {largest} is outside the vocabulary of {item.cardinality} "
                             "(cardinality); raise its cardinality or map the token into the vocabulary.")
        when = "in training" if scoring else f"by its cardinality={item.cardinality}"
        raise ValueError(f"{where}: category {largest} was not seen {when} (categories 0..{item.cardinality - 1}); "
                         "unseen categories are an error: map them to a known category first"
                         + ("." if scoring else ", or raise its cardinality."))
    measured = with_measured(item, hi, largest)
    if measured.pad is not None and measured.pad >= (measured.cardinality or 0):
        raise ValueError(f"{where}: pad={measured.pad} is outside the vocabulary of {measured.cardinality}; the "
                         "padding id is one of the ids 0..cardinality-1.")
    return measured


def _measure(df: DataFrame, items: Sequence[Input]) -> Any:
    """One row: the row count, and every input's aggregates (`_aggregates`, suffixed by its position)."""
    aggregates = [a for n, item in enumerate(items) for a in _aggregates(df, n, item)]
    return df.agg(F.count(F.lit(1)).alias("rows"), *aggregates).collect()[0]


def resolve_inputs(df: DataFrame, items: Sequence[Input | dict[str, Any]]) -> InputSpec:
    """The inputs with widths and cardinalities, after one aggregate over `df` checked every value."""
    parsed = parse_inputs(items)
    row = _measure(df, parsed)
    if not row["rows"]:
        raise ValueError("the training data is empty (0 rows); check the input path, table or filter.")
    return InputSpec(tuple(_checked(row, n, item, scoring=False) for n, item in enumerate(parsed)))


def check_ids(df: DataFrame, spec: InputSpec) -> None:
    """Data to score against a trained `spec`: same widths, ids within the trained cardinalities. No rows:
    nothing to check (scoring an empty table gives an empty table)."""
    row = _measure(df, spec.inputs)
    if row["rows"]:
        for n, item in enumerate(spec.inputs):
            _checked(row, n, item, scoring=True)


def packed_columns(df: DataFrame, spec: InputSpec) -> tuple[Column, Column]:
    """(features array<float>, ids array<bigint>): the numeric inputs side by side, and the id inputs."""
    floats = [values_column(df, i) for i in spec.inputs if not i.is_ids]
    ids = [values_column(df, i) for i in spec.inputs if i.is_ids]
    ids = [F.array(c) if i.kind == "categorical" else c
           for c, i in zip(ids, [i for i in spec.inputs if i.is_ids], strict=True)]
    return (F.concat(*floats) if floats else F.array().cast("array<float>"),
            F.concat(*ids) if ids else F.array().cast("array<bigint>"))
