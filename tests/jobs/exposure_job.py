"""spark-submit job for the exposure test: each backend trains slowly enough (rank 0 sleeps each step) for the
test to list every listening socket on every host while training runs, after start-up. Checkpoints under
`<workdir>/ckpt-<backend>` tell the test when training is under way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import TrainConfig, train


def job(spark: SparkSession) -> dict:
    data_path, settings, workdir = sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
    df = spark.read.parquet(data_path)
    report = {}
    for backend in ("torch_gloo", "horovod"):
        result = train(spark, df, TrainConfig(**settings, backend=backend, faults={"slow_rank": 0, "slow_ms": 150},
                                              checkpoint={"dir": str(workdir / f"ckpt-{backend}"), "every_steps": 5}))
        report[backend] = [s["task_address"] for s in result.rank_summaries]
    return report


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-exposure-test").getOrCreate(), job)
