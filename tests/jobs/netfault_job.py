"""spark-submit job for the network-fault test. The test pulls a host's cable while the two faulty runs
train (it watches their checkpoint folders, and the marker this job writes between them):

1. a clean run;
2. the same with max_restarts=0: fails, naming the cut-off rank;
3. the same with max_restarts=1: relaunched from its checkpoint once the link is back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import TrainConfig, TrainingError, train


def job(spark: SparkSession) -> dict:
    data_path, settings, workdir = sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
    df = spark.read.parquet(data_path).cache()
    clean = train(spark, df, TrainConfig(**settings))
    report: dict = {"clean_history": clean.history}
    try:
        train(spark, df, TrainConfig(**settings, checkpoint={"dir": str(workdir / "ckpt-exhaust"), "every_steps": 5,
                                                             "keep": 50}))
        report["exhausted"] = None
    except TrainingError as err:
        report["exhausted"] = str(err)
    (workdir / "exhausted.json").write_text(json.dumps(report["exhausted"]))
    faulty = train(spark, df, TrainConfig(**settings, max_restarts=1,
                                          checkpoint={"dir": str(workdir / "ckpt-relaunch"), "every_steps": 5,
                                                      "keep": 50}))
    report.update(
        faulty_history=faulty.history,
        resumed_at=[s["resumed_at"] for s in faulty.rank_summaries],
        max_param_diff=max(float((p - q).abs().max()) for p, q in
                           zip(clean.model.parameters(), faulty.model.parameters(), strict=True)),
    )
    return report


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.appName("blocksync-netfault-test").getOrCreate(), job)
