"""spark-submit job of `benchmarks/memory.py`: a block 4x the Python worker's limit, in both modes.

`disk` must finish; `memory` must be refused before launch. Writes {block_mb, disk, memory} to argv[2].
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from blocksync import ModelSpec, TrainConfig, train_files


def main(path: str, out: str) -> None:
    spark = SparkSession.builder.appName("blocksync-memory-limit").getOrCreate()
    report: dict = {}
    try:
        for storage in ("disk", "memory"):
            cfg = TrainConfig(num_workers=2, backend="torch_gloo", epochs=1, batch_size=4096, lr=0.01,
                              block_storage=storage, memory_budget_mb=64, check_every=0,
                              model=ModelSpec(name="logreg"))
            try:
                result = train_files(spark, path, cfg)
                report["block_mb"] = max(result.block_sizes) * (4 * result.num_features + 8) / 2**20
                report[storage] = (f"completed, peak RSS per worker {max(result.metrics['peak_rss_mb']):,.0f} MiB, "
                                   f"train loss {result.metrics['train_loss']:.4f}")
            except ValueError as err:
                report[storage] = f"refused before launch: {err}"
    finally:
        spark.stop()
    with open(out, "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
