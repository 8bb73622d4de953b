"""Why Horovod trails torch_gloo in training on a shared machine: per-phase step times and a cycle-time sweep.

The throughput benchmark's job (mlp [256, 256], global batch 4,096, one thread per worker) with 2 and 4
workers, torch_gloo against horovod at HOROVOD_CYCLE_TIME 0.2, 1 (the default) and 5 ms, alternating,
REPETITIONS rounds. Per contender: the steady step period (median, as in `throughput`), and rank 0's
median and 95th-percentile compute time (forward and backward, no communication) and sync time.

What it shows: Horovod's background thread runs a coordination round with every other rank once per
cycle whether or not a tensor is pending (`RunLoopOnce` calls `ComputeResponseList` every cycle), so
on cores shared by all ranks it takes CPU from the compute phase (higher compute p50 and p95 than
torch_gloo on the same data) and adds up to a cycle plus a coordination round to every all-reduce.
A longer cycle does fewer rounds but waits longer; a shorter one the reverse; neither closes the gap.
"""

from __future__ import annotations

import dataclasses

from benchmarks.common import cached_blocks, median, steady_step_seconds, write
from benchmarks.data import synthetic
from benchmarks.throughput import WARMUP, config

WORKER_COUNTS = [2, 4]
CONTENDERS = [("torch_gloo", None), ("horovod", 0.2), ("horovod", 1.0), ("horovod", 5.0)]
REPETITIONS = 2


def one_run(spark, blocks, info, workers: int, backend: str, cycle_ms: float | None) -> dict:
    from blocksync import train_blocks

    cfg = config(workers, backend)
    if cycle_ms is not None:
        cfg = dataclasses.replace(cfg, horovod=dataclasses.replace(cfg.horovod, cycle_time_ms=cycle_ms))
    result = train_blocks(spark, blocks, info, cfg)
    timing = result.metrics["timing"]["0"]
    return {"step_ms": 1e3 * steady_step_seconds(result, WARMUP), "compute_p50_ms": timing["compute_p50_ms"],
            "compute_p95_ms": timing["compute_p95_ms"], "sync_p50_ms": timing["sync_p50_ms"]}


def run(spark) -> dict:
    data = synthetic()
    rows = []
    for workers in WORKER_COUNTS:
        blocks, info = cached_blocks(spark, data.train_files, workers)
        samples: dict[tuple, list[dict]] = {c: [] for c in CONTENDERS}
        try:
            for rep in range(REPETITIONS):
                for backend, cycle in CONTENDERS:  # alternating
                    out = one_run(spark, blocks, info, workers, backend, cycle)
                    samples[(backend, cycle)].append(out)
                    print(f"rep {rep + 1}/{REPETITIONS} x{workers} {backend} cycle={cycle}: {out}", flush=True)
        finally:
            blocks.unpersist()
        for (backend, cycle), outs in samples.items():
            rows.append({"workers": workers, "backend": backend, "cycle_time_ms": cycle,
                         **{k: median([o[k] for o in outs]) for k in outs[0]}})
    lines = ["# Horovod against torch_gloo in training: phases and HOROVOD_CYCLE_TIME (rank 0, medians of "
             f"{REPETITIONS})", "", "| workers | backend | cycle time | step | compute p50 | compute p95 | sync p50 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cycle = "-" if r["cycle_time_ms"] is None else f"{r['cycle_time_ms']:g} ms"
        lines.append(f"| {r['workers']} | {r['backend']} | {cycle} | {r['step_ms']:.1f} ms | "
                     f"{r['compute_p50_ms']:.1f} ms | {r['compute_p95_ms']:.1f} ms | {r['sync_p50_ms']:.1f} ms |")
    payload = {"rows": rows, "repetitions": REPETITIONS}
    write("horovod_profile", payload, "\n".join(lines) + "\n")
    return payload
