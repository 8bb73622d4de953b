"""A one-stage check that a collective backend starts inside barrier tasks and sums correctly.

Each of `num_workers` tasks starts the backend, all-reduces a vector filled
with (rank + 1), and returns what it received; the exact answer is
N(N+1)/2 everywhere. Used by the tests and handy on a new cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import torch
from pyspark.sql import SparkSession

from blocksync.collectives import start_collective


def allreduce_check(
    spark: SparkSession, *, backend: str = "horovod", num_workers: int = 4, length: int = 1024,
    timeout_seconds: int = 60, interface: str | None = None,
) -> list[dict]:
    """One dict per rank: rank, backend size, and the distinct values it received."""

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
