"""Blocks read straight from Parquet files: each worker reads its own row range, no Spark shuffle.

`make_blocks` cuts balanced, content-hashed blocks with two Spark shuffles of
the whole data set. When the data already sits in Parquet files, a worker can
instead read its block itself, as Horovod's and TorchDistributor's users do
with per-rank shards, and the shuffles disappear.

How the row ranges are planned and read: `plan_shards`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.types as pat

from blocksync.engine.driver.blocks import (
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
from blocksync.engine.plan import Piece, ShardPlan
from blocksync.engine.worker.shard_reader import is_list as _is_list


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
    weight: str | None = None, cut: Callable[[int, tuple | None, Any, int], list[int] | None] | None = None,
) -> tuple[ShardPlan, BlockInfo]:
    """Assign every row of the Parquet files at `paths` to one of `num_workers` balanced, contiguous blocks.

    `weight`: a numeric column of per-row weights, read with the rows (each worker checks its own
    are finite and >= 0). `cut` (balance=speed): called with the feature width, label facts, None and
    the row count, returns the ranks' sizes, which replace the balanced ones in step 1 (None: keep them).

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
    labels = _label_range(dataset, [rg for _, rg in groups], label, spark, paths)
    sizes = [total // num_workers + (1 if r < total % num_workers else 0) for r in range(num_workers)]
    weighted = cut(num_features, labels, None, total) if cut is not None else None
    sizes = weighted if weighted is not None else sizes  # None: the even cut
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
    paths_used = sorted({p.path for rank_pieces in pieces for p in rank_pieces})
    facts = {i.path: (int(i.size), i.mtime_ns) for i in dataset.filesystem.get_file_info(paths_used)}
    plan = ShardPlan(filesystem=dataset.filesystem, features=columns, label=label, pieces=pieces, weight=weight,
                     file_facts=facts, largest_group_bytes=max(int(rg.total_byte_size or 0) for _, rg in groups))
    return plan, BlockInfo(num_features=num_features, sizes=sizes, labels=labels)
