"""spark-submit job of the `balance` benchmark: one Spark application on the capped standalone cluster.

argv: the Parquet folder, the result file, and a JSON of {"period_us", "cgroups": [one per worker],
"schedule": [{"case", "contender", "cores": [one per worker]}, ...]}. Before each run it writes every
worker cgroup's cpu.cfs_quota_us (cores x period), then trains with `train_files` and records what
metrics.json says. The first run is a warm-up without caps (Python workers started, torch imported).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from unittest import mock

from pyspark.sql import SparkSession

from blocksync import ModelSpec, TrainConfig, train_files
from blocksync.engine.driver import balancing

EPOCHS = 4
BATCH = 4096


def cap(cgroups: list[str], cores: list[float] | None, period_us: int) -> None:
    """Each worker's CPU capacity: cores x period of CPU time per period (-1: no cap)."""
    for folder, share in zip(cgroups, cores or [None] * len(cgroups), strict=True):
        quota = -1 if share is None else max(1000, int(round(share * period_us)))
        Path(folder, "cpu.cfs_quota_us").write_text(str(quota))


def one(spark: SparkSession, data: str, workers: int, contender: str) -> dict:
    """`none` and `even`: balance=even; `speed`: balance=speed; `proportional`: balance=speed cut by the rule
    before fixed step costs (blocks in proportion to the rates at the even batch), the baseline of the cut's
    step-time model: the driver's `balanced_speeds` returns the measured rates as they are."""
    probed = contender in ("speed", "proportional")
    cfg = TrainConfig(num_workers=workers, backend="torch_gloo", epochs=EPOCHS, batch_size=BATCH,
                      threads_per_worker=1, model=ModelSpec(name="mlp", hidden=[256, 256]), optimizer="adam",
                      balance="speed" if probed else "even", check_every=0)
    started = time.perf_counter()
    with mock.patch.object(balancing, "balanced_speeds", lambda batch, rows, speeds, fixed: list(speeds)) \
            if contender == "proportional" else contextlib.nullcontext():
        result = train_files(spark, data, cfg)
    m, b = result.metrics, result.metrics["balance"]
    return {"samples_per_sec": m["samples_per_sec"], "train_seconds": m["train_seconds"],
            "wall_seconds": time.perf_counter() - started, "block_sizes": result.block_sizes,
            "sync_idle_seconds": b["sync_idle_seconds"], "train_rows_per_s": b["train_rows_per_s"],
            "train_executors": [s["task_address"] for s in result.rank_summaries],
            **({k: b[k] for k in ("probe_rows_per_s", "probe_fixed_seconds", "probes", "probe_executors",
                                  "block_of_rank", "misplaced_ranks", "cut", "probe_seconds")} if probed else {})}


def main() -> None:
    data, out, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    cgroups, period = params["cgroups"], params["period_us"]
    for folder in cgroups:
        Path(folder, "cpu.cfs_period_us").write_text(str(period))
    spark = SparkSession.builder.appName("blocksync-balance-bench").getOrCreate()
    runs = []
    try:
        cap(cgroups, None, period)
        one(spark, data, len(cgroups), "speed")  # warm-up, uncapped: the Python workers start and import torch
        for item in params["schedule"]:
            cap(cgroups, item["cores"], period)
            runs.append({**item, **one(spark, data, len(cgroups), item["contender"])})
            print(f"{item['case']} {item['contender']}: {runs[-1]['samples_per_sec']:,.0f} samples/s", flush=True)
    finally:
        cap(cgroups, None, period)
        spark.stop()
    Path(out).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
