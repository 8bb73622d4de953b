"""The benchmarks' synthetic job: seeded binary classification, written once as Parquet shards.

1,048,576 training rows x 128 float32 features in 8 equal files (so 1, 2, 4 or
8 readers each get whole files) plus 65,536 test rows. Features are standard
normal; the label is 1 where x.w + 0.3 n > 0 (w a fixed random unit vector, n
standard normal noise), so the best possible accuracy is about 0.90 and a
linear model can reach it. Every contender reads these same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DATA = Path(__file__).resolve().parent / ".data"
ROWS = 1 << 20
TEST_ROWS = 1 << 16
FEATURES = 128
FILES = 8
NOISE = 0.3
SEED = 2026


@dataclass(frozen=True)
class Dataset:
    train_files: list[str]
    test_file: str
    rows: int
    features: int


def _rows(rng: np.random.Generator, w: np.ndarray, n: int) -> pa.Table:
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    y = ((x @ w + NOISE * rng.standard_normal(n, dtype=np.float32)) > 0).astype(np.int64)
    features = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES)
    # Spark reads list<float>; a fixed-size list would arrive as an array too, but keep the common type.
    return pa.table({"features": features.cast(pa.list_(pa.float32())), "label": pa.array(y)})


def synthetic(directory: Path = DATA) -> Dataset:
    """The dataset, generated on first use (about 550 MB) and reused afterwards."""
    train_dir, test_file = directory / f"train-{ROWS}x{FEATURES}", directory / f"test-{TEST_ROWS}.parquet"
    files = [str(train_dir / f"part-{i}.parquet") for i in range(FILES)]
    if not (test_file.exists() and all(Path(f).exists() for f in files)):
        train_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(SEED)
        w = rng.standard_normal(FEATURES).astype(np.float32)
        w /= np.linalg.norm(w)
        for f in files:
            pq.write_table(_rows(rng, w, ROWS // FILES), f + ".tmp")
            Path(f + ".tmp").rename(f)
        pq.write_table(_rows(rng, w, TEST_ROWS), str(test_file) + ".tmp")
        Path(str(test_file) + ".tmp").rename(test_file)
    return Dataset(train_files=files, test_file=str(test_file), rows=ROWS, features=FEATURES)


def load_numpy(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [n, FEATURES], labels int64 [n]) of the given shards, in order."""
    table = pa.concat_tables(pq.read_table(f) for f in files)
    flat = table.column("features").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    # Copies: Arrow's buffers are read-only, and torch.from_numpy wants writable memory.
    return flat.reshape(-1, FEATURES).astype(np.float32), table.column("label").to_numpy().copy()


def accuracy(state: dict, test_file: str, hidden: list[int]) -> float:
    """Test accuracy of a state_dict of blocksync's `mlp` (or `logreg` when hidden is empty) on the test rows."""
    import torch

    from blocksync.engine.config import ModelSpec
    from blocksync.engine.models import build_model

    spec = ModelSpec(name="mlp", hidden=hidden) if hidden else ModelSpec(name="logreg")
    model = build_model(spec, FEATURES, 2)
    model.load_state_dict(state)
    x, y = load_numpy([test_file])
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
