"""spark-submit job for the namespace-cluster tests: train on the given Parquet with each backend; report
the parameters, the replicas' digests and where the ranks ran."""

from __future__ import annotations

import json
import sys

from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import TrainConfig, TrainingError, train


def job(spark: SparkSession) -> dict:
    data_path, settings = sys.argv[2], json.loads(sys.argv[3])
    abort_check = settings.pop("abort_check", False)
    df = spark.read.parquet(data_path)
    report: dict = {}
    for backend in settings.pop("backends"):
        result = train(spark, df, TrainConfig(**settings, backend=backend))
        report[backend] = {
            "params": [p.detach().flatten().tolist() for p in result.model.parameters()],
            "digests": [s["digest"] for s in result.rank_summaries],
            "task_addresses": [s["task_address"] for s in result.rank_summaries],
        }
    if abort_check:  # Gloo pairs over loopback across hosts: the connect fails inside Horovod's C++ and aborts
        try:
            train(spark, df, TrainConfig(**settings, backend="horovod", network_interface="lo",
                                         gloo_timeout_seconds=20))
            report["abort"] = None
        except TrainingError as err:
            report["abort"] = str(err)
    return report


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-netcluster-test").getOrCreate(), job)
