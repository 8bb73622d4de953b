"""Helpers the tests share: a seeded split with standardization, accuracy on a
scored DataFrame, a one-stage all-reduce check of a collective backend, and the
blocks of a blocked DataFrame as NumPy arrays."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from pyspark.ml.feature import StandardScaler, StandardScalerModel, VectorAssembler
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blocksync.engine.comm.collectives import start_collective


def allreduce_check(
    spark: SparkSession, *, backend: str = "horovod", num_workers: int = 4, length: int = 1024,
    timeout_seconds: int = 60, interface: str | None = None,
) -> list[dict]:
    """One dict per rank: rank, backend size, and the distinct values it received.

    Each of `num_workers` barrier tasks starts the backend and all-reduces a
    vector filled with (rank + 1); the exact answer is N(N+1)/2 everywhere.
    """

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import BarrierTaskContext

        for _ in batches:  # the input rows only place the tasks
            pass
        ctx = BarrierTaskContext.get()
        coll = start_collective(backend, ctx, timeout_seconds=timeout_seconds, interface=interface)
        try:
            out = coll.allreduce_sum(torch.full((length,), float(coll.rank + 1)))
            values = sorted(set(out.tolist()))
            report = {"rank": coll.rank, "size": coll.size, "values": values}
        finally:
            coll.close()
        yield pa.RecordBatch.from_pydict({"report": [json.dumps(report)]})

    seeds = spark.range(num_workers).repartition(num_workers)
    rows = seeds.mapInArrow(task, "report string", barrier=True).collect()
    return sorted((json.loads(r["report"]) for r in rows), key=lambda r: r["rank"])


def split_standardized(
    df: DataFrame, feature_cols: list[str], *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[DataFrame, DataFrame, StandardScalerModel]:
    """(train, test, scaler): seeded split, then mean/std from the train split only (Spark ML)."""
    assembled = VectorAssembler(inputCols=feature_cols, outputCol="raw_features").transform(df)
    train, test = assembled.randomSplit([1.0 - test_fraction, test_fraction], seed=seed)
    scaler = StandardScaler(inputCol="raw_features", outputCol="features", withMean=True, withStd=True).fit(train)
    keep = ["features", *[c for c in df.columns if c not in feature_cols]]
    return scaler.transform(train).select(keep), scaler.transform(test).select(keep), scaler


def accuracy(model: torch.nn.Module, df: DataFrame) -> float:
    """Share of rows of `df` (ML vector `features`, class index `label`) that `model` classifies right."""
    pdf = df.select("features", "label").toPandas()
    x = torch.tensor(np.stack([v.toArray() for v in pdf["features"]]), dtype=torch.float32)
    with torch.no_grad():
        pred = model(x).argmax(1).numpy()
    return float((pred == pdf["label"].to_numpy()).mean())


def collect_blocks(blocks: DataFrame, num_workers: int) -> list[tuple[np.ndarray, ...]]:
    """Per partition (= rank), (features float32 [n, d], labels float64 [n]) in the partition's row order,
    and the row weights float64 [n] third when the blocks have a `weight` column."""
    rows = blocks.withColumn("_pid", F.spark_partition_id()).collect()  # partition order kept
    out: list[tuple[np.ndarray, ...]] = []
    for rank in range(num_workers):
        mine = [r for r in rows if r["_pid"] == rank]
        x = np.array([r["features"] for r in mine], dtype=np.float32)
        y = np.array([r["label"] for r in mine], dtype=np.float64)
        if "weight" in blocks.columns:
            out.append((x, y, np.array([r["weight"] for r in mine], dtype=np.float64)))
        else:
            out.append((x, y))
    return out


def own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory folder, when we may add child cgroups to it (root); else None."""
    return own_cgroup("memory")


def own_cgroup(controller: str) -> Path | None:
    """This process's cgroup v1 folder of `controller` (memory, cpu), when we may add child cgroups to it
    (root); else None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = Path(f"/sys/fs/cgroup/{controller}{path}")
            return folder if os.geteuid() == 0 and os.access(folder, os.W_OK) else None
    return None


def collect_typed_blocks(blocks: DataFrame, num_workers: int, layout: list[tuple[str, str, int]]) -> list[tuple]:
    """Like `collect_blocks`, for typed inputs: per rank ({input name: values}, labels[, weights]), decoded
    from the blocks' columns by the documented layout: the numeric inputs side by side in `features`
    (float32), the token and categorical inputs side by side in `ids` (int64), each in `layout` order
    [(name, kind, width)]; a categorical input is one id a row, [n]."""
    rows = blocks.withColumn("_pid", F.spark_partition_id()).collect()
    out: list[tuple] = []
    for rank in range(num_workers):
        mine = [r for r in rows if r["_pid"] == rank]
        floats = np.array([r["features"] for r in mine], dtype=np.float32).reshape(len(mine), -1)
        ids = np.array([r["ids"] for r in mine], dtype=np.int64).reshape(len(mine), -1)
        parts, at = {}, {"numeric": 0, "ids": 0}
        for name, kind, width in layout:
            matrix, key = (floats, "numeric") if kind == "numeric" else (ids, "ids")
            value = matrix[:, at[key]:at[key] + width]
            parts[name] = value[:, 0] if kind == "categorical" else value
            at[key] += width
        y = np.array([r["label"] for r in mine], dtype=np.float64)
        weights = (np.array([r["weight"] for r in mine], dtype=np.float64),) if "weight" in blocks.columns else ()
        out.append((parts, y, *weights))
    return out
