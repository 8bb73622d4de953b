"""spark-submit job for the fake-GPU test: which GPU each task got, and what a GPU-less executor does."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from blocksync import ModelSpec, TrainConfig, TrainingError, train


def main(out_path: str) -> None:
    spark = SparkSession.builder.appName("blocksync-gpu-discovery-test").getOrCreate()
    try:
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 3, 400)
        x = rng.normal(size=(400, 8)).astype(np.float32) + labels[:, None]
        df = spark.createDataFrame(pd.DataFrame({"features": list(x), "label": labels}))
        common = dict(num_workers=4, backend="torch_gloo", epochs=1, batch_size=50, model=ModelSpec(name="logreg"))
        auto = train(spark, df, TrainConfig(**common, device="auto"))
        try:
            train(spark, df, TrainConfig(**common, device="cuda"))
            demanded = "no error"
        except TrainingError as err:
            demanded = str(err)
        report = {
            "gpus": [s["gpu_addresses"] for s in auto.rank_summaries],
            "devices": [s["device"] for s in auto.rank_summaries],
            "warnings": [s["device_warning"] for s in auto.rank_summaries],
            "executors": sorted({s["task_address"] for s in auto.rank_summaries}),
            "demanded_cuda": demanded,
        }
        with open(out_path, "w") as fh:
            json.dump(report, fh)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
