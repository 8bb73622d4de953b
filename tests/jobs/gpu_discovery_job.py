"""spark-submit job for the fake-GPU test: which GPU each task got, and what a GPU-less executor does."""

from __future__ import annotations

import numpy as np
import pandas as pd
from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import ModelSpec, TrainConfig, TrainingError, train


def job(spark: SparkSession) -> dict:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 400)
    x = rng.normal(size=(400, 8)).astype(np.float32) + labels[:, None]
    df = spark.createDataFrame(pd.DataFrame({"features": list(x), "label": labels}))
    common = dict(num_workers=4, backend="torch_gloo", epochs=1, batch_size=50, model=ModelSpec(name="logreg"))
    # overlap: the bucketed path (its own CUDA stream, pinned staging for Gloo where CUDA works) runs too.
    auto = train(spark, df, TrainConfig(**common, device="auto", overlap=True, bucket_mb=16 / 2**20))
    try:
        train(spark, df, TrainConfig(**common, device="cuda"))
        demanded = "no error"
    except TrainingError as err:
        demanded = str(err)
    return {
        "gpus": [s["gpu_addresses"] for s in auto.rank_summaries],
        "devices": [s["device"] for s in auto.rank_summaries],
        "warnings": [s["device_warning"] for s in auto.rank_summaries],
        "executors": sorted({s["task_address"] for s in auto.rank_summaries}),
        "digests": [s["digest"] for s in auto.rank_summaries],
        "demanded_cuda": demanded,
    }


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-gpu-discovery-test").getOrCreate(), job)
