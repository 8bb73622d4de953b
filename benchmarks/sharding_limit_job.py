"""One run of the `sharding_limit` benchmark (see sharding_limit.py): argv = unused, result path, shard."""

import json
import sys
import time

import numpy as np
import pandas as pd

from benchmarks.sharding import BATCH, FEATURES, HIDDEN
from blocksync import ModelSpec, TrainConfig, TrainingError, train

WORKERS = 4
STEPS = 6


def config(shard: str) -> TrainConfig:
    return TrainConfig(num_workers=WORKERS, backend="horovod", epochs=1, batch_size=BATCH, optimizer="adam", lr=1e-4,
                       shard=shard, threads_per_worker=1, check_every=0, blocks="shuffle",
                       model=ModelSpec(name="mlp", hidden=HIDDEN))


def main(out: str, shard: str) -> None:
    from blocksync.pipeline.session import local_session

    spark = local_session(f"local[{WORKERS}]", "blocksync-sharding-limit", {
        "spark.python.daemon.module": "benchmarks.cgroup_daemon", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, FEATURES), dtype=np.float32)
    df = spark.createDataFrame(pd.DataFrame({"features": list(x), "label": (x[:, 0] > 0).astype(np.int64)}))
    started = time.perf_counter()
    try:
        m = train(spark, df, config(shard)).metrics
        report = {"shard": shard, "ok": True, "steps": m["steps"], "peak_anon_mb": m["peak_anon_mb"],
                  "anon_at_model_mb": m["anon_at_model_mb"], "optimizer_bytes_per_rank": m["optimizer_bytes_per_rank"],
                  "train_loss": m["train_loss"]}
    except TrainingError as err:
        report = {"shard": shard, "ok": False, "error": str(err), "kind": err.kind}
    report["seconds"] = time.perf_counter() - started
    spark.stop()
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[2], sys.argv[3])
