"""Worker side of blocks=files: read one rank's row ranges of the Parquet files (see `driver.shards`)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyarrow.types as pat

from blocksync.engine.plan import ShardPlan


def is_list(kind: pa.DataType) -> bool:
    return pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind)


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
        yield piece_arrays(plan, table.slice(piece.start, piece.stop - piece.start), num_features)


def piece_arrays(plan: ShardPlan, table: pa.Table, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    for name in [*plan.features, plan.label, *([plan.weight] if plan.weight else [])]:
        if table.column(name).null_count:
            raise ValueError(f"{table.column(name).null_count} rows have a null {name!r}; drop or fill them first.")
    x = np.empty((table.num_rows, num_features), dtype=np.float32)
    if len(plan.features) == 1 and is_list(table.schema.field(plan.features[0]).type):
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
