"""spark-submit job for the object-store test: input Parquet and checkpoints on an S3 server on another host.

The workers read their rows of the Parquet straight from S3 (blocks=files); a run whose rank 1 dies at
step 12 relaunches from its S3 checkpoint and must end bitwise equal to a fault-free run.
"""

from __future__ import annotations

import json
import sys

import boto3
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import TrainConfig, train_files

BUCKET = "blocksync"


def job(spark: SparkSession) -> dict:
    local_data, settings = sys.argv[2], json.loads(sys.argv[3])
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    s3, _ = pafs.FileSystem.from_uri(f"s3://{BUCKET}")
    pq.write_table(pq.read_table(local_data), f"{BUCKET}/data/part-0.parquet", filesystem=s3)
    source, ckpt = f"s3://{BUCKET}/data", f"s3://{BUCKET}/ckpt"
    clean = train_files(spark, source, TrainConfig(**settings))
    faulty = train_files(spark, source, TrainConfig(
        **settings, max_restarts=1, checkpoint={"dir": ckpt, "every_steps": 5, "keep": 2},
        faults={"kill_rank": 1, "at_step": 12, "mode": "exit"}))
    objects = sorted(i.path for i in s3.get_file_info(pafs.FileSelector(f"{BUCKET}/ckpt", recursive=True))
                     if i.type == pafs.FileType.File)
    return {
        "resumed_at": [s["resumed_at"] for s in faulty.rank_summaries],
        "max_param_diff": max(float((p - q).abs().max()) for p, q in
                              zip(clean.model.parameters(), faulty.model.parameters(), strict=True)),
        "same_history": faulty.history == clean.history,
        "checkpoint_objects": objects,
    }


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-s3-test").getOrCreate(), job)
