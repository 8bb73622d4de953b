"""All-reduce inside barrier tasks: horovod, torch_gloo and spark backends, 4 workers on local[4].

For each message size S every contender runs one barrier stage per repetition
(contenders alternate: rep 1 horovod, torch_gloo, spark; rep 2 ...). Inside a
stage, rank 0 times `iters` back-to-back all-reduces after a warm-up and a
barrier. Reported per backend and size: the median over repetitions of the
time per all-reduce, algorithm bandwidth S/t, bus bandwidth S/t x 2(N-1)/N
(NCCL-tests' convention), and busbw over a memcpy bandwidth measured in the same
run (numpy copy of 64 MB: the single-host limit when all ranks share one
memory system).

The spark backend is measured up to 1 MB only: every byte goes through the
driver as base64, which is the reason it is documented for tiny models only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np

from benchmarks.common import figure, median, save_figure, write

SIZES = [4 * 1024, 64 * 1024, 1024 * 1024, 16 * 1024 * 1024, 64 * 1024 * 1024]
BACKENDS = ["horovod", "torch_gloo", "spark"]
SPARK_MAX = 1024 * 1024
WORKERS = 4
REPETITIONS = 3


def memcpy_bandwidth(size: int = 64 * 1024 * 1024, iters: int = 10) -> float:
    src = np.ones(size // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for _ in range(iters):
        np.copyto(dst, src)
    return size * iters / (time.perf_counter() - start)


def stage(spark, backend: str, sizes: list[int], workers: int = WORKERS,
          counts: dict[int, int] | None = None) -> dict[int, float]:
    """Seconds per all-reduce for each size (`counts[size]` timed back to back), timed on rank 0."""
    # Computed here: the task must not refer to this module, which executors cannot import.
    counts = counts or {size: 3 if backend == "spark" else int(min(50, max(5, 2e8 // size))) for size in sizes}

    def task(batches: Iterator) -> Iterator:
        import pyarrow as pa
        import torch
        from pyspark import BarrierTaskContext

        from blocksync.engine.comm.collectives import start_collective

        for _ in batches:
            pass
        ctx = BarrierTaskContext.get()
        torch.set_num_threads(1)
        coll = start_collective(backend, ctx, timeout_seconds=300, interface=None)
        out = {}
        try:
            for size in sizes:
                buf = torch.ones(size // 4)
                n = counts[size]
                coll.allreduce_sum(buf)  # warm-up
                coll.allreduce_sum(torch.zeros(1))  # barrier
                start = time.perf_counter()
                for _ in range(n):
                    coll.allreduce_sum(buf)
                out[size] = (time.perf_counter() - start) / n
        finally:
            coll.close()
        if coll.rank == 0:
            yield pa.RecordBatch.from_pydict({"timings": [json.dumps(out)]})

    rows = spark.range(workers).repartition(workers).mapInArrow(task, "timings string", barrier=True).collect()
    return {int(k): v for k, v in json.loads(rows[0]["timings"]).items()}


def run(spark) -> dict:
    memcpy = memcpy_bandwidth()
    samples: dict[str, dict[int, list[float]]] = {b: {s: [] for s in SIZES} for b in BACKENDS}
    for rep in range(REPETITIONS):
        for backend in BACKENDS:
            sizes = [s for s in SIZES if backend != "spark" or s <= SPARK_MAX]
            for size, seconds in stage(spark, backend, sizes).items():
                samples[backend][size].append(seconds)
            print(f"rep {rep + 1}/{REPETITIONS} {backend} done", flush=True)
    factor = 2 * (WORKERS - 1) / WORKERS
    rows = []
    for backend in BACKENDS:
        for size in SIZES:
            if not samples[backend][size]:
                continue
            t = median(samples[backend][size])
            rows.append({"backend": backend, "bytes": size, "seconds": t, "algbw_GBps": size / t / 1e9,
                         "busbw_GBps": size / t * factor / 1e9, "busbw_over_memcpy": size / t * factor / memcpy,
                         "repetitions": len(samples[backend][size])})
    payload = {"workers": WORKERS, "memcpy_GBps": memcpy / 1e9, "rows": rows,
               "method": "median over alternating repetitions of rank 0's mean time per all-reduce"}
    lines = [f"# All-reduce, {WORKERS} workers on local[{WORKERS}]", "",
             f"memcpy bandwidth in the same run: {memcpy / 1e9:.2f} GB/s", "",
             "| backend | size | time per all-reduce | algbw GB/s | busbw GB/s | busbw / memcpy |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['backend']} | {_size(r['bytes'])} | {r['seconds'] * 1e3:.3f} ms | {r['algbw_GBps']:.3f} "
                     f"| {r['busbw_GBps']:.3f} | {r['busbw_over_memcpy']:.3f} |")
    write("allreduce", payload, "\n".join(lines) + "\n")
    _plot(rows)
    return payload


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MB" if n >= 1024 * 1024 else f"{n // 1024} KB"


def _plot(rows: list[dict]) -> None:
    fig, ax = figure()
    for backend in BACKENDS:
        mine = [r for r in rows if r["backend"] == backend]
        ax.plot([r["bytes"] for r in mine], [r["busbw_GBps"] for r in mine], marker="o", label=backend)
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
           title=f"all-reduce, {WORKERS} workers on local[{WORKERS}]")
    ax.legend()
    save_figure(fig, "allreduce")
