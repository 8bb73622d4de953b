"""One run of the `memory_limit` benchmark (see memory_limit.py): argv = data path, result path, storage."""

import json
import sys
import time

from blocksync import ModelSpec, TrainConfig, TrainingError, train_files
from blocksync.pipeline.session import local_session


def main(path: str, out: str, storage: str) -> None:
    spark = local_session("local[2]", "blocksync-memory-limit", {
        "spark.python.daemon.module": "benchmarks.cgroup_daemon", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    cfg = TrainConfig(num_workers=1, backend="torch_gloo", epochs=1, batch_size=4096, lr=0.01, check_every=0,
                      block_storage=storage, memory_budget_mb=64, model=ModelSpec(name="logreg"),
                      timeouts={"step_seconds": 600, "barrier_seconds": 1800})
    started = time.perf_counter()
    try:
        result = train_files(spark, path, cfg)
        m = result.metrics
        report = {"storage": storage, "ok": True, "steps": m["steps"], "peak_rss_mb": m["peak_rss_mb"],
                  "samples_per_sec": m["samples_per_sec"], "train_loss": m["train_loss"]}
    except TrainingError as err:
        report = {"storage": storage, "ok": False, "error": str(err), "kind": err.kind}
    report["seconds"] = time.perf_counter() - started
    spark.stop()
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
