"""Peak resident memory per worker against block size, block_storage=memory against disk.

In this process's local[4] session, 2 workers (blocks=files) train one epoch of a logistic regression
on synthetic blocks of 1x, 4x and 16x BASE_MB each, in both modes, alternating, two runs each. Each rank
reports its peak RSS (VmHWM from /proc, reset at task start), as the OS counts it; the same runs give
both modes' steady-state samples/s (median step) on data that fits.

A block several times larger than an enforced limit is `memory_limit`'s job (a cgroup's limit: Spark's
spark.executor.pyspark.memory limits a worker's address space, which torch, pyarrow's allocator and Gloo's
threads exceed by reserving more than they use; see the README, "Data larger than memory").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import figure, save_figure, write

BASE_MB = 24
FEATURES = 256
FACTORS = [1, 4, 16]
WORKERS = 2
REPO = Path(__file__).resolve().parent.parent
ROW_BYTES = 4 * FEATURES + 8


def synthetic_files(directory: Path, block_mb: float, workers: int = WORKERS, seed: int = 0,
                    group_rows: int = 65536) -> str:
    """Parquet files holding `workers` blocks of about `block_mb` each, written `group_rows` rows at a time."""
    rows = int(block_mb * 2**20 / ROW_BYTES) * workers
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(FEATURES, 4)).astype(np.float32)
    schema = pa.schema([("features", pa.list_(pa.float32(), FEATURES)), ("label", pa.int64())])
    path = directory / f"data-{block_mb:g}.parquet"
    with pq.ParquetWriter(path, schema) as out:
        for lo in range(0, rows, group_rows):
            x = rng.normal(size=(min(group_rows, rows - lo), FEATURES)).astype(np.float32)
            y = (x @ w).argmax(1)
            feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), FEATURES)
            out.write_table(pa.table({"features": feats, "label": y}, schema=schema), row_group_size=group_rows)
    return str(path)


def one(spark, path: str, storage: str) -> dict:
    from blocksync import ModelSpec, TrainConfig, train_files

    cfg = TrainConfig(num_workers=WORKERS, backend="torch_gloo", epochs=1, batch_size=4096, lr=0.01,
                      block_storage=storage, memory_budget_mb=64, check_every=0, model=ModelSpec(name="logreg"))
    result = train_files(spark, path, cfg)
    m = result.metrics
    return {"storage": storage, "peak_rss_mb": m["peak_rss_mb"], "samples_per_sec": 4096 / (m["median_step_ms"] / 1e3),
            "block_mb": max(result.block_sizes) * ROW_BYTES / 2**20}


def run(spark) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        for factor in FACTORS:
            path = synthetic_files(Path(tmp), BASE_MB * factor)
            for storage in ("memory", "disk", "memory", "disk"):  # alternating, two each
                rows.append({"factor": factor, **one(spark, path, storage)})
            print(f"{factor}x done", flush=True)
    payload = {"workers": WORKERS, "base_block_mb": BASE_MB, "features": FEATURES, "rows": rows}
    write("memory", payload, markdown(rows))
    plot(rows)
    return payload


def _median(values: list[float]) -> float:
    return float(np.median(values))


def markdown(rows: list[dict]) -> str:
    lines = ["# Peak RSS per worker against block size (2 workers, logreg, one epoch)", "",
             "| block per worker | memory: peak RSS | disk: peak RSS | memory: samples/s | disk: samples/s | "
             "disk / memory |", "| --- | --- | --- | --- | --- | --- |"]
    for factor in FACTORS:
        mine = {s: [r for r in rows if r["factor"] == factor and r["storage"] == s] for s in ("memory", "disk")}
        peak = {s: _median([max(r["peak_rss_mb"]) for r in v]) for s, v in mine.items()}
        rate = {s: _median([r["samples_per_sec"] for r in v]) for s, v in mine.items()}
        lines.append(f"| {mine['memory'][0]['block_mb']:,.0f} MiB | {peak['memory']:,.0f} MiB | "
                     f"{peak['disk']:,.0f} MiB | {rate['memory']:,.0f} | {rate['disk']:,.0f} | "
                     f"{rate['disk'] / rate['memory']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict]) -> None:
    fig, ax = figure()
    for storage, marker in (("memory", "o"), ("disk", "s")):
        mine = [r for r in rows if r["storage"] == storage]
        ax.plot([r["block_mb"] for r in mine], [max(r["peak_rss_mb"]) for r in mine], marker, label=storage)
    ax.set(xlabel="block per worker (MiB)", ylabel="peak RSS of a worker (MiB, VmHWM)",
           title="peak RSS of a worker against its block (2 workers, 64k-row row groups)")
    ax.legend()
    save_figure(fig, "memory")
