"""spark-submit job for the standalone-cluster test: train on digits, write accuracy and placement."""

from __future__ import annotations

from job_report import run_and_report
from pyspark.sql import SparkSession
from tests.helpers import accuracy, split_standardized

from blocksync import ModelSpec, TrainConfig, train
from blocksync.pipeline.datasets import digits_frame


def job(spark: SparkSession) -> dict:
    train_df, test_df, _ = split_standardized(
        digits_frame(spark), [f"pixel_{i}" for i in range(64)], test_fraction=0.2, seed=42
    )
    cfg = TrainConfig(num_workers=4, backend="horovod", epochs=20, batch_size=64, lr=2e-3,
                      model=ModelSpec(name="mlp", hidden=[128, 64]))
    result = train(spark, train_df, cfg)
    return {
        "accuracy": accuracy(result.model, test_df),
        "task_addresses": [s["task_address"] for s in result.rank_summaries],
        "master": spark.sparkContext.master,
    }


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-cluster-test").getOrCreate(), job)
