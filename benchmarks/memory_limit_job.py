"""One run of the `memory_limit` benchmark (see memory_limit.py): argv = data path, result path, storage,
epoch order, `limited` (the Python workers join the benchmark's cgroup) or `unlimited`, and the model:
`logreg` (reading-bound: about 1 GB/s of rows in memory) or `mlp` (compute-bound, hidden [128, 64])."""

import json
import sys
import time

from blocksync import ModelSpec, TrainConfig, TrainingError, train_files
from blocksync.pipeline.session import local_session

CHUNK_MB = 4.03125
"""4,096 rows of 1,032 bytes: one row group of the benchmark's files (what `stream` decodes at once). The 48 MiB
budget makes `disk` windows of 5 chunks (20 MiB): two windows and a batch of 4,089 rows take 44 MiB; `stream`
also counts decoding a row group (3 x its 4.6 MiB), which leaves windows of 3 chunks: 42 MiB in all."""
BUDGET_MB = 48


def main(path: str, out: str, storage: str, order: str, limited: str, model: str = "logreg") -> None:
    conf = {"spark.driver.memory": "2g"}
    if limited == "limited":
        conf["spark.python.daemon.module"] = "benchmarks.cgroup_daemon"
    spark = local_session("local[2]", "blocksync-memory-limit", conf)
    spark.sparkContext.setLogLevel("ERROR")
    cfg = TrainConfig(num_workers=1, backend="torch_gloo", epochs=1, batch_size=4096, lr=0.01, check_every=0,
                      block_storage=storage, memory_budget_mb=BUDGET_MB, model=ModelSpec(name=model),
                      epoch_order=order, chunk_mb=CHUNK_MB, timeouts={"step_seconds": 600, "barrier_seconds": 1800})
    started = time.perf_counter()
    try:
        result = train_files(spark, path, cfg)
        m = result.metrics
        report = {"storage": storage, "order": order, "limited": limited == "limited", "ok": True, "model": model,
                  "steps": m["steps"], "peak_rss_mb": m["peak_rss_mb"], "peak_anon_mb": m["peak_anon_mb"],
                  "samples_per_sec": m["samples_per_sec"], "train_seconds": m["train_seconds"],
                  "read_seconds": m["read_seconds"], "direct_reads": m["direct_reads"], "train_loss": m["train_loss"],
                  "data_p50_ms": m["timing"]["0"]["data_p50_ms"], "data_p95_ms": m["timing"]["0"]["data_p95_ms"],
                  "median_step_ms": m["median_step_ms"]}
    except TrainingError as err:
        report = {"storage": storage, "order": order, "limited": limited == "limited", "ok": False, "model": model,
                  "error": str(err), "kind": err.kind}
    report["seconds"] = time.perf_counter() - started
    spark.stop()
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:7])
