"""The big-model benchmark's token job: seeded sequences for blocksync's `transformer`, written once as Parquet.

TRAIN_ROWS training rows in SHARDS equal files plus TEST_ROWS test rows. Each row holds LENGTH token ids
(column `tokens`, list<int64>): 8 to LENGTH ids drawn uniformly from 1..VOCAB-1, padded with PAD (0) to
LENGTH. Every id has a fixed random score in {-1, +1}; the label is 1 where the scores of the row's tokens
sum to more than 0, so the task needs the whole sequence and a mean-pooling encoder can learn it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.data import DATA

TRAIN_ROWS = 16384
TEST_ROWS = 4096
SHARDS = 4
LENGTH = 32
VOCAB = 256
PAD = 0
SEED = 2026
COLUMN = "tokens"
OPTIONS = {"d_model": 128, "heads": 4, "layers": 2, "dim_feedforward": 512}
NET = {"kind": "transformer", "options": OPTIONS, "vocab": VOCAB, "length": LENGTH, "pad": PAD}


def _rows(rng: np.random.Generator, scores: np.ndarray, n: int) -> pa.Table:
    lengths = rng.integers(8, LENGTH + 1, n)
    ids = rng.integers(1, VOCAB, (n, LENGTH))
    ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = PAD
    label = (scores[ids].sum(axis=1) > 0).astype(np.int64)  # scores[PAD] is 0
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), LENGTH).cast(pa.list_(pa.int64()))
    return pa.table({COLUMN: tokens, "label": pa.array(label)})


def token_files(directory: Path = DATA) -> tuple[list[str], str]:
    """(training shards, test file), generated on first use and reused afterwards."""
    folder = directory / f"tokens-{TRAIN_ROWS}x{LENGTH}"
    files = [str(folder / f"part-{i}.parquet") for i in range(SHARDS)]
    test_file = str(folder / "test.parquet")
    if not all(Path(f).exists() for f in [*files, test_file]):
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(SEED)
        scores = rng.choice([-1, 1], VOCAB)
        scores[PAD] = 0
        for f, n in [*((f, TRAIN_ROWS // SHARDS) for f in files), (test_file, TEST_ROWS)]:
            pq.write_table(_rows(rng, scores, n), f + ".tmp")
            Path(f + ".tmp").rename(f)
    return files, test_file


def load_tokens(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids int64 [n, LENGTH], labels int64 [n]) of the given files, in order."""
    table = pa.concat_tables(pq.read_table(f) for f in files)
    flat = table.column(COLUMN).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, LENGTH).astype(np.int64), table.column("label").to_numpy().copy()


def blocksync_inputs() -> list[dict[str, Any]]:
    """The `inputs` blocksync's `train` takes for the token column."""
    return [{"name": COLUMN, "kind": "tokens", "cardinality": VOCAB, "pad": PAD}]
