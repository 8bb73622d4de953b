"""spark-submit job for the lost-executor test: the same training with and without killing rank 1's executor."""

from __future__ import annotations

import tempfile

from job_report import run_and_report
from pyspark.sql import SparkSession
from tests.helpers import split_standardized

from blocksync import ModelSpec, TrainConfig, train
from blocksync.pipeline.datasets import digits_frame


def job(spark: SparkSession) -> dict:
    train_df, _, _ = split_standardized(
        digits_frame(spark), [f"pixel_{i}" for i in range(64)], test_fraction=0.2, seed=42
    )
    train_df = train_df.cache()
    settings = dict(num_workers=4, backend="horovod", epochs=1, batch_size=64, lr=2e-3, seed=3,
                    model=ModelSpec(name="mlp", hidden=[32]))
    clean = train(spark, train_df, TrainConfig(**settings))
    with tempfile.TemporaryDirectory() as ckpt:
        faulty = train(spark, train_df, TrainConfig(
            **settings, max_restarts=1, checkpoint={"dir": ckpt, "every_steps": 5},
            faults={"kill_rank": 1, "at_step": 12, "mode": "executor"},
        ))
    diff = max(float((p - q).abs().max()) for p, q in
               zip(clean.model.parameters(), faulty.model.parameters(), strict=True))
    return {
        "max_param_diff": diff,
        "clean_history": clean.history,
        "faulty_history": faulty.history,
        "resumed_at": [s["resumed_at"] for s in faulty.rank_summaries],
        "clean_addresses": [s["task_address"] for s in clean.rank_summaries],
        "faulty_addresses": [s["task_address"] for s in faulty.rank_summaries],
    }


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-lost-executor-test").getOrCreate(), job)
