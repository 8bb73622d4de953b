"""spark-submit job of `benchmarks/netcluster.py`, run on the namespace cluster at one link rate.

`python netcluster_job.py OUT '{"rate_bit": 1e8, "sizes": [...], "compression": true}'` measures, with
one rank per host: all-reduce seconds per size for horovod and torch_gloo; steady-state step time of
a 200k-parameter MLP for 1, 2 and 3 ranks (weak scaling, 64 rows per rank per step); and, when asked,
the step time of each compression mode on 3 ranks. Writes JSON to OUT.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from benchmarks.allreduce import stage
from blocksync import ModelSpec, TrainConfig, train

HOSTS = 3
ROWS_PER_RANK_STEP = 64
STEPS = 40
FEATURES, CLASSES = 128, 10
MODEL = ModelSpec(name="mlp", hidden=[512, 256])  # 199,690 parameters: 799 kB of float32 gradients


def floor_seconds(size: int, workers: int, rate_bit: float) -> float:
    """The ring all-reduce's bandwidth floor 2(N-1)/N x S / B."""
    return 2 * (workers - 1) / workers * size / (rate_bit / 8)


def allreduce_rows(spark: SparkSession, sizes: list[int], rate_bit: float) -> list[dict]:
    rows = []
    for backend in ("horovod", "torch_gloo"):
        # About 3 s of back-to-back all-reduces per size, at least 3.
        counts = {s: int(max(3, min(50, 3.0 / floor_seconds(s, HOSTS, rate_bit)))) for s in sizes}
        for size, seconds in stage(spark, backend, sizes, workers=HOSTS, counts=counts).items():
            predicted = floor_seconds(size, HOSTS, rate_bit)
            rows.append({"backend": backend, "bytes": size, "seconds": seconds, "floor_seconds": predicted,
                         "measured_over_floor": seconds / predicted, "count": counts[size]})
    return rows


def frame(spark: SparkSession, ranks: int):
    rng = np.random.default_rng(0)
    n = ranks * ROWS_PER_RANK_STEP * STEPS
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n)
    return spark.createDataFrame(pd.DataFrame({"features": list(x), "label": y})).cache()


def step_seconds(spark: SparkSession, df, ranks: int, **settings) -> dict:
    cfg = TrainConfig(num_workers=ranks, epochs=1, batch_size=ranks * ROWS_PER_RANK_STEP, model=MODEL, seed=1,
                      check_every=0, **settings)
    result = train(spark, df, cfg)
    step = result.metrics["median_step_ms"] / 1e3
    return {"ranks": ranks, "median_step_seconds": step, "samples_per_sec": ranks * ROWS_PER_RANK_STEP / step,
            "sync_fraction": result.metrics["sync_fraction"], "payload_bytes_per_step":
            result.metrics["payload_bytes_per_step"], **settings}


def job(spark: SparkSession, params: dict) -> dict:
    rate = float(params["rate_bit"])
    report: dict = {"rate_bit": rate, "allreduce": allreduce_rows(spark, params["sizes"], rate), "scaling": []}
    for backend in ("horovod", "torch_gloo"):
        for ranks in range(1, HOSTS + 1):
            report["scaling"].append(step_seconds(spark, frame(spark, ranks), ranks, backend=backend))
    if params.get("compression"):
        df = frame(spark, HOSTS)
        report["compression"] = [step_seconds(spark, df, HOSTS, backend="horovod", compression=mode)
                                 for mode in ("none", "fp16", "topk", "int8")]
    return report


if __name__ == "__main__":
    session = SparkSession.builder.appName("blocksync-netcluster-bench").getOrCreate()
    try:
        out = job(session, json.loads(sys.argv[2]))
        with open(sys.argv[1], "w") as fh:
            json.dump(out, fh)
    finally:
        session.stop()
