"""Blocks read straight from Parquet files: each worker reads its own row range, no Spark shuffle.

`make_blocks` cuts balanced, content-hashed blocks with two Spark shuffles of
the whole data set. When the data already sits in Parquet files, a worker can
instead read its block itself, as Horovod's and TorchDistributor's users do
with per-rank shards, and the shuffles disappear:

1. Driver (`plan_shards`): list the files with pyarrow (any pyarrow filesystem:
   local, HDFS, S3, GCS), read only their footers, and lay all row groups end to
   end in path order. Rank r gets the global row range
   [sum(sizes[:r]), sum(sizes[:r+1])), sizes differing by at most one row: the
   same balance `make_blocks` guarantees. Label min and max come from the row
   group statistics (a one-column Spark aggregate when a file has none).
2. Worker (`iter_pieces`): read the row groups overlapping its range one at a
   time (only the feature and label columns, and the weight column when one is
   named), slice each to the range and hand it on as float32 features and
   float64 labels (label and weight pairs with weights), into the block in
   memory or on disk (`block_store`). The per-epoch shuffle of the worker loop then visits
   the block in random order.

Unlike `make_blocks`, a block is a contiguous run of the files, not a hash
spread. With gradient sync every step's global batch is still drawn from all
blocks; with `sync: parameters` (local SGD) data sorted by label would give
skewed blocks, so shuffle such data first or use blocks=shuffle. ML vector
columns (a Parquet struct) are not read here; store features as an array or
numeric columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyarrow.types as pat

from blocksync.engine.blocks import (
    LABEL,
    BlockInfo,
    array_not_numeric,
    check_enough_rows,
    check_label,
    check_label_not_a_feature,
    feature_names,
    features_not_numeric,
    label_aggregates,
    label_column,
    label_facts,
    label_not_numeric,
)


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one row group of one file."""

    path: str
    row_group: int
    start: int
    stop: int


@dataclass(frozen=True)
class ShardPlan:
    """What every worker needs to read its block: the filesystem and, per rank, its pieces."""

    filesystem: pafs.FileSystem
    features: list[str]
    """One array column, or numeric columns stacked in this order."""
    label: str
    pieces: list[list[Piece]]
    weight: str | None = None
    """A numeric column of per-row weights; targets are then (label, weight) pairs."""


def _dataset(paths: str | list[str]) -> ds.Dataset:
    try:
        if isinstance(paths, list) and paths and "://" in paths[0]:  # file URIs, as DataFrame.inputFiles() gives
            filesystem, local = _uri_paths(paths)
            return ds.dataset(local, format="parquet", filesystem=filesystem)
        return ds.dataset(paths, format="parquet")
    except (FileNotFoundError, OSError, pa.ArrowInvalid) as err:
        raise ValueError(
            f"cannot read Parquet files at {paths!r}: {err}; check the path and that it holds Parquet."
        ) from err


def _uri_paths(uris: list[str]) -> tuple[pafs.FileSystem, list[str]]:
    """One filesystem for a list of file URIs on it, and their paths there (one URI resolution, not one each:
    an object store's resolves its region over the network)."""
    filesystem, first = pafs.FileSystem.from_uri(uris[0])
    prefix = uris[0][: len(uris[0]) - len(first)] if uris[0].endswith(first) else None
    paths = []
    for uri in uris:
        if prefix is not None and uri.startswith(prefix):
            paths.append(uri[len(prefix):])
        else:  # an escaped character: let pyarrow decode it
            paths.append(pafs.FileSystem.from_uri(uri)[1])
    return filesystem, paths


def _is_list(kind: pa.DataType) -> bool:
    return pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind)


def _is_number(kind: pa.DataType) -> bool:
    return pat.is_integer(kind) or pat.is_floating(kind)


def _feature_columns(schema: pa.Schema, features: str | list[str]) -> list[str]:
    names = feature_names(features, schema.names, "the Parquet files", "an array column")
    types = {n: schema.field(n).type for n in names}
    if len(names) == 1 and _is_list(types[names[0]]):
        value_type = types[names[0]].value_type
        if not _is_number(value_type):
            raise array_not_numeric(names[0], f"a list of {value_type}")
        return names
    bad = {n: str(t) for n, t in types.items() if not _is_number(t)}
    if bad:
        hint = (" An ML vector column cannot be read from the files; store features as array<float> "
                "or train with blocks=shuffle.") if any(pat.is_struct(types[n]) for n in bad) else ""
        raise features_not_numeric(bad, f".{hint}")
    return names


def _num_features(dataset: ds.Dataset, columns: list[str]) -> int:
    if len(columns) > 1 or not _is_list(dataset.schema.field(columns[0]).type):
        return len(columns)
    kind = dataset.schema.field(columns[0]).type
    if pat.is_fixed_size_list(kind):
        return int(kind.list_size)
    first = dataset.head(1, columns=columns).column(0)  # workers check that every row has this length
    if len(first) == 0 or first[0].as_py() is None:
        return 0
    return len(first[0].as_py())


def _label_range(dataset: ds.Dataset, row_groups: list[Any], label: str, spark: Any, paths: Any) -> tuple:
    """(min, max, non-integer count) of the label: from footers, else one Spark aggregate.

    Footers give min and max only, so the non-integer count is 0 here; every
    worker checks its own labels are class indices before training starts.
    """
    stats = [(rg.statistics or {}).get(label) or {} for rg in row_groups]
    if stats and all(s.get("min") is not None and s.get("max") is not None for s in stats):
        return (min(float(s["min"]) for s in stats), max(float(s["max"]) for s in stats), 0)
    df = spark.read.parquet(*([paths] if isinstance(paths, str) else paths))
    return label_facts(df.select(label_column(df, label).alias(LABEL)).agg(*label_aggregates()).collect())


def plan_shards(
    spark: Any, paths: str | list[str], *, features: str | list[str], label: str, num_workers: int,
    weight: str | None = None,
) -> tuple[ShardPlan, BlockInfo]:
    """Assign every row of the Parquet files at `paths` to one of `num_workers` balanced, contiguous blocks.

    `weight`: a numeric column of per-row weights, read with the rows (each worker checks its own
    are finite and >= 0)."""
    check_label_not_a_feature(features, label)
    dataset = _dataset(paths)
    columns = _feature_columns(dataset.schema, features)
    check_label(label, dataset.schema.names, "the Parquet files")
    kind = dataset.schema.field(label).type
    if not _is_number(kind):
        raise label_not_numeric(label, str(kind))
    if weight is not None and (weight not in dataset.schema.names
                               or not _is_number(dataset.schema.field(weight).type)):
        raise ValueError(f"weight column {weight!r} is not a numeric column of the Parquet files "
                         f"(columns: {sorted(dataset.schema.names)}); name one, or leave the weight unset.")
    fragments = sorted(dataset.get_fragments(), key=lambda f: f.path)
    groups = [(f.path, rg) for f in fragments for rg in f.row_groups if rg.num_rows]
    total = sum(rg.num_rows for _, rg in groups)
    if total == 0:
        raise ValueError(f"the Parquet files at {paths!r} hold 0 rows; check the path.")
    check_enough_rows(total, num_workers)
    num_features = _num_features(dataset, columns)
    if num_features == 0:
        raise ValueError("feature arrays are empty or null in the first row; every row needs features.")
    sizes = [total // num_workers + (1 if r < total % num_workers else 0) for r in range(num_workers)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    pieces: list[list[Piece]] = [[] for _ in range(num_workers)]
    offset = 0
    for path, rg in groups:
        lo, hi = offset, offset + rg.num_rows
        for rank in range(num_workers):
            start, stop = max(lo, int(bounds[rank])), min(hi, int(bounds[rank + 1]))
            if start < stop:
                pieces[rank].append(Piece(path, rg.id, start - lo, stop - lo))
        offset = hi
    labels = _label_range(dataset, [rg for _, rg in groups], label, spark, paths)
    plan = ShardPlan(filesystem=dataset.filesystem, features=columns, label=label, pieces=pieces, weight=weight)
    return plan, BlockInfo(num_features=num_features, sizes=sizes, labels=labels)


def read_block(plan: ShardPlan, rank: int, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [n, d], labels float64 [n]) of `rank`'s pieces, in plan order, each piece
    copied once straight into the block."""
    n = sum(p.stop - p.start for p in plan.pieces[rank])
    x = np.empty((n, num_features), dtype=np.float32)
    y = np.empty((n,), dtype=np.float64)
    row = 0
    for xp, yp in iter_pieces(plan, rank, num_features):
        x[row:row + len(xp)], y[row:row + len(yp)] = xp, yp
        row += len(xp)
    return x, y


def iter_pieces(plan: ShardPlan, rank: int, num_features: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`rank`'s rows as (features float32 [k, d], labels float64 [k]), one row-group slice at a time:
    at most one row group is held while reading."""
    columns = [*plan.features, plan.label, *([plan.weight] if plan.weight else [])]
    files: dict[str, pq.ParquetFile] = {}
    for piece in plan.pieces[rank]:
        try:
            if piece.path not in files:
                files[piece.path] = pq.ParquetFile(plan.filesystem.open_input_file(piece.path))
            table = files[piece.path].read_row_group(piece.row_group, columns=columns)
        except OSError as err:  # e.g. a path only the driver sees
            raise ValueError(
                f"cannot read {piece.path} on this executor ({err}); blocks=files needs the files at the same "
                "path on every executor (a shared filesystem or object store), else use blocks=shuffle."
            ) from err
        yield _piece_arrays(plan, table.slice(piece.start, piece.stop - piece.start), num_features)


def _piece_arrays(plan: ShardPlan, table: pa.Table, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    for name in [*plan.features, plan.label, *([plan.weight] if plan.weight else [])]:
        if table.column(name).null_count:
            raise ValueError(f"{table.column(name).null_count} rows have a null {name!r}; drop or fill them first.")
    x = np.empty((table.num_rows, num_features), dtype=np.float32)
    if len(plan.features) == 1 and _is_list(table.schema.field(plan.features[0]).type):
        at = 0
        for chunk in table.column(plan.features[0]).chunks:
            lengths = pc.list_value_length(chunk)
            if len(chunk) and (pc.min(lengths).as_py() != num_features or pc.max(lengths).as_py() != num_features):
                raise ValueError(
                    f"feature arrays have lengths {pc.min(lengths).as_py()}..{pc.max(lengths).as_py()}, "
                    f"expected {num_features}; every row needs the same number of features."
                )
            flat = chunk.flatten().to_numpy(zero_copy_only=False)  # a view for float32 values
            x[at:at + len(chunk)] = flat.reshape(-1, num_features)
            at += len(chunk)
    else:
        for j, name in enumerate(plan.features):
            x[:, j] = table.column(name).to_numpy()
    y = table.column(plan.label).to_numpy().astype(np.float64)
    if plan.weight:
        y = np.stack([y, table.column(plan.weight).to_numpy().astype(np.float64)], axis=1)
    return x, y
