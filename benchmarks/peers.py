"""Peers on the same job: what a user would pick instead of blocksync, timed to the same test accuracy.

Two jobs on the synthetic 1,048,576 x 128 binary task (benchmarks/data.py):

- MLP (128 -> 256 -> 256 -> 2, Adam lr 1e-3, global batch 4,096, one epoch,
  2 workers with one thread each) by blocksync (horovod backend), by
  TorchDistributor (pyspark.ml.torch.distributor, torchrun + DDP over Gloo) and
  by horovod.spark.run (Horovod's own Spark launcher); benchmarks/peer_fns.py
  holds the peers' training function: each rank reads its Parquet shards.
- Logistic regression: blocksync's `logreg` (2 workers, one per core of this
  machine, Adam lr 0.01, batch 4,096, one epoch) against Spark MLlib's
  LogisticRegression (L-BFGS, local[4]) on the same rows as a cached vector
  column, with the fewest iterations of 1, 2, 3, 5, 10, 20, 40 that reach the
  target (chosen before the timed repetitions, so MLlib gets its best setting).

Time-to-accuracy: wall time from the call on the driver to a trained model on
the driver, everything included (Spark stages, reading the data, start-up of
the processes and collectives, training); the model's accuracy on the 65,536
test rows must reach the target, else the row says so. Contenders alternate
within each repetition. blocksync appears twice per job, both from the same
Parquet files inside the timed call: `train_files` (blocks=files: each worker
reads its balanced row range of the files itself, as the peers' ranks read
their shards) and `train` on `spark.read.parquet` (blocks=shuffle: Spark cuts
content-hashed balanced blocks, two shuffles of the whole data set), and
`train` on the same `spark.read.parquet` with the default blocks=auto, which
recognizes the plain Parquet scan and reads the files as `train_files` does.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.common import figure, median, save_figure, write
from benchmarks.data import Dataset, accuracy, synthetic

HIDDEN = [256, 256]
BATCH = 4096
MLP_WORKERS = 2
LR_WORKERS = 2
TARGET = {"mlp": 0.88, "logreg": 0.89}
MLLIB_ITERATIONS = [1, 2, 3, 5, 10, 20, 40]
REPETITIONS = 3
FILES = "blocksync train_files ({}, blocks=files)"
SHUFFLE = "blocksync train ({}, blocks=shuffle)"
AUTO = "blocksync train ({}, blocks=auto)"
VARIANTS = ("files", "shuffle", "auto")


def _state(numpy_state: dict) -> dict:
    return {k: torch.from_numpy(v) for k, v in numpy_state.items()}


def _net(data: Dataset) -> dict[str, Any]:
    """The MLP, as benchmarks/peer_fns.py describes networks."""
    return {"kind": "mlp", "hidden": HIDDEN, "features": data.features}


def _blocksync(spark, data: Dataset, workers: int, model, lr: float, blocks: str) -> tuple[Any, float]:
    """Trained model and seconds, from the Parquet files: `train_files` (blocks="files") or
    `train` on spark.read.parquet (blocks="shuffle" or "auto")."""
    from blocksync import TrainConfig, train, train_files

    cfg = TrainConfig(num_workers=workers, backend="horovod", epochs=1, batch_size=BATCH, optimizer="adam", lr=lr,
                      seed=0, threads_per_worker=1, model=model, blocks=blocks)
    start = time.perf_counter()
    if blocks == "files":
        result = train_files(spark, data.train_files, cfg)
    else:
        result = train(spark, spark.read.parquet(*data.train_files), cfg)
    return result.model, time.perf_counter() - start


def blocksync_mlp(spark, data: Dataset, blocks: str) -> tuple[float, float]:
    from blocksync import ModelSpec

    model, seconds = _blocksync(spark, data, MLP_WORKERS, ModelSpec(name="mlp", hidden=HIDDEN), 1e-3, blocks)
    return seconds, accuracy(model.state_dict(), data.test_file, HIDDEN)


def torch_distributor(spark, data: Dataset) -> tuple[float, float]:
    from pyspark.ml.torch.distributor import TorchDistributor

    from benchmarks.peer_fns import ddp_train

    start = time.perf_counter()
    state = TorchDistributor(num_processes=MLP_WORKERS, local_mode=False, use_gpu=False).run(
        ddp_train, data.train_files, _net(data), BATCH, 1, 1e-3)
    seconds = time.perf_counter() - start
    return seconds, accuracy(_state(state), data.test_file, HIDDEN)


def horovod_spark(spark, data: Dataset) -> tuple[float, float]:
    import horovod.spark

    from benchmarks.peer_fns import horovod_train

    start = time.perf_counter()
    states = horovod.spark.run(horovod_train, args=(data.train_files, _net(data), BATCH, 1, 1e-3),
                               num_proc=MLP_WORKERS, use_gloo=True, nics=["lo"], start_timeout=120, verbose=0)
    seconds = time.perf_counter() - start
    return seconds, accuracy(_state(states[0]), data.test_file, HIDDEN)


def blocksync_logreg(spark, data: Dataset, blocks: str) -> tuple[float, float]:
    from blocksync import ModelSpec

    model, seconds = _blocksync(spark, data, LR_WORKERS, ModelSpec(name="logreg"), 0.01, blocks)
    return seconds, accuracy(model.state_dict(), data.test_file, [])


def mllib_logreg(spark, data: Dataset, iterations: int) -> tuple[float, float]:
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.functions import array_to_vector

    def vectors(paths: list[str]):
        return spark.read.parquet(*paths).select(array_to_vector("features").alias("features"), "label")

    start = time.perf_counter()
    df = vectors(data.train_files).cache()
    df.count()
    model = LogisticRegression(maxIter=iterations, regParam=0.0, tol=1e-9).fit(df)
    seconds = time.perf_counter() - start
    df.unpersist()
    scored = model.transform(vectors([data.test_file]))
    return seconds, float(MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored))


def _mllib_iterations(spark, data: Dataset) -> int:
    for iterations in MLLIB_ITERATIONS:
        _, acc = mllib_logreg(spark, data, iterations)
        print(f"MLlib maxIter={iterations}: accuracy {acc:.4f}", flush=True)
        if acc >= TARGET["logreg"]:
            return iterations
    return MLLIB_ITERATIONS[-1]


def run(spark) -> dict:
    data = synthetic()
    iterations = _mllib_iterations(spark, data)
    mlp, lr = f"mlp, {MLP_WORKERS} workers", f"logreg, {LR_WORKERS} workers"
    # name: (job, which blocksync variant or None for a peer, function)
    contenders: dict[str, tuple[str, str | None, Any]] = {
        FILES.format(mlp): ("mlp", "files", lambda s, d: blocksync_mlp(s, d, "files")),
        SHUFFLE.format(mlp): ("mlp", "shuffle", lambda s, d: blocksync_mlp(s, d, "shuffle")),
        AUTO.format(mlp): ("mlp", "auto", lambda s, d: blocksync_mlp(s, d, "auto")),
        "TorchDistributor DDP (2 processes)": ("mlp", None, torch_distributor),
        "horovod.spark.run (2 processes)": ("mlp", None, horovod_spark),
        FILES.format(lr): ("logreg", "files", lambda s, d: blocksync_logreg(s, d, "files")),
        SHUFFLE.format(lr): ("logreg", "shuffle", lambda s, d: blocksync_logreg(s, d, "shuffle")),
        AUTO.format(lr): ("logreg", "auto", lambda s, d: blocksync_logreg(s, d, "auto")),
        f"MLlib LogisticRegression (maxIter={iterations})": ("logreg", None,
                                                             lambda s, d: mllib_logreg(s, d, iterations)),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for rep in range(REPETITIONS):
        for name, (_, _, fn) in contenders.items():
            seconds, acc = fn(spark, data)
            samples[name].append((seconds, acc))
            print(f"rep {rep + 1}/{REPETITIONS} {name}: {seconds:.1f} s, accuracy {acc:.4f}", flush=True)
    rows = []
    for name, (job, variant, _) in contenders.items():
        seconds = median([s for s, _ in samples[name]])
        accs = [a for _, a in samples[name]]
        rows.append({"contender": name, "job": job, "variant": variant, "seconds": seconds, "accuracy_min": min(accs),
                     "target": TARGET[job], "reached": min(accs) >= TARGET[job], "repetitions": len(accs)})
    for row in rows:
        ours = {r["variant"]: r["seconds"] for r in rows if r["job"] == row["job"] and r["variant"]}
        for variant in VARIANTS:
            row[f"{variant}_over_this"] = ours[variant] / row["seconds"]
    payload = {"rows": rows, "data_rows": data.rows, "features": data.features, "global_batch": BATCH,
               "method": f"median wall time over {REPETITIONS} alternating repetitions, call to model on the driver"}
    write("peers", payload, _markdown(payload))
    _plot(rows)
    return payload


def _markdown(p: dict) -> str:
    lines = [f"# Peers: time to accuracy, {p['data_rows']:,} x {p['features']} synthetic rows", "",
             "Wall time from the call to a trained model on the driver (median); accuracy on 65,536 test rows "
             "(worst repetition). Ratios: blocksync's time over the contender's (below 1: blocksync is faster), "
             "for blocks=files (`train_files`), blocks=shuffle and blocks=auto (`train`).", "",
             "| job | contender | time to accuracy | accuracy | target | files / this | shuffle / this | auto / this |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["rows"]:
        reached = "" if r["reached"] else " (not reached)"
        lines.append(f"| {r['job']} | {r['contender']} | {r['seconds']:.1f} s | {r['accuracy_min']:.4f}{reached} "
                     f"| {r['target']} | {r['files_over_this']:.2f} | {r['shuffle_over_this']:.2f} "
                     f"| {r['auto_over_this']:.2f} |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict]) -> None:
    fig, ax = figure(8, 4)
    ax.barh([r["contender"] for r in rows][::-1], [r["seconds"] for r in rows][::-1],
            color=["tab:blue" if r["variant"] else "tab:gray" for r in rows][::-1])
    ax.set(xlabel="time to accuracy (s, median)", title="blocksync and its peers on the same job")
    save_figure(fig, "peers")
