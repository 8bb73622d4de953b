"""`balance: speed`'s probe: each rank's training step rate on synthetic batches of the real shapes."""

from __future__ import annotations

import json
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import torch

from blocksync.engine.balance import step_fixed_seconds
from blocksync.engine.config import TrainConfig
from blocksync.engine.inputs import InputSpec
from blocksync.engine.losses import import_loss, loss_sum
from blocksync.engine.models import build_model
from blocksync.engine.optim import build_optimizer
from blocksync.engine.worker.trainer import straggle

PROBE_SCHEMA_DDL = "payload string"
WARMUP_STEPS = 2
MIN_STEPS = 5
"""Steps of each of the probe's two batch sizes, at least, for their means."""
WINDOW_SECONDS = 0.5
"""Each rank times steps for this long (at least MIN_STEPS of each size): long enough that the ranks' windows
overlap (they start together, in one stage) and that a CPU cap's throttling periods (cfs_period_us, 100 ms by
default) average out over several of them."""


def probe_costs(config: TrainConfig, num_features: int, num_outputs: int, inputs: InputSpec | None,
                batch_rows: int, rank: int) -> tuple[float, float]:
    """(rows per second at `batch_rows`, the step's fixed seconds) of forward, backward and the configured
    optimizer's step on synthetic rows, as rank `rank` (a `faults.slow_rank` straggles here as in training).

    Steps alternate between `batch_rows` and half as many rows, so both sizes share the window's conditions;
    two warm-up steps, then steps for WINDOW_SECONDS and at least MIN_STEPS of each size. The rate is rows over
    the mean step time at `batch_rows`, not a median's: under a CPU cap the steps that fall in a throttled part
    of a period take the time the cap removes, and a median of short steps would skip them. The fixed part is
    a fraction of that mean step: the intercept of the line through the two sizes' mean CPU seconds a step
    (`balance.step_fixed_seconds`) over the full size's. CPU time, because a cap's throttling and other
    processes' time slices land on whichever step is running and would bend the line (a half step that fits a
    period's quota is never throttled, a full one is), while a cap or a slower core stretches a step's fixed
    and per-row work alike."""
    torch.manual_seed(config.seed)
    model = build_model(config.model, num_features, num_outputs, inputs)
    optimizer = build_optimizer(model, config)
    for group in optimizer.param_groups:
        group["lr"] = 0.0  # the step's cost (Adam's moments included), never a change that matters
    x = torch.randn(batch_rows, num_features)
    ids = torch.zeros(batch_rows, inputs.id_width if inputs is not None else 0, dtype=torch.long)
    y = torch.randint(0, num_outputs, (batch_rows,)).double()  # class indices; any float for regression
    custom = import_loss(config.loss) if config.loss else None
    slow = config.faults.slow_rank == rank
    factor, extra = (config.faults.slow_factor, config.faults.slow_ms / 1000.0) if slow else (1.0, 0.0)
    sizes = (batch_rows, max(1, batch_rows // 2))
    times: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    i = 0
    while sum(map(sum, times)) < WINDOW_SECONDS or min(map(len, times)) < MIN_STEPS:
        rows = sizes[i % 2]
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        out = model(x[:rows] if inputs is None else inputs.model_input(x[:rows], ids[:rows]))
        loss_sum(out.float(), y[:rows], config.task, None, custom, config.label_smoothing).backward()
        optimizer.step()
        cpu_seconds = time.process_time() - c0  # before the straggler's sleep, which stretches it like a cap
        straggle(time.perf_counter() - t0, factor, extra)
        if i >= WARMUP_STEPS:
            times[i % 2].append(time.perf_counter() - t0)
            cpu[i % 2].append(cpu_seconds)
        i += 1
    step = statistics.fmean(times[0])
    full_cpu, half_cpu = statistics.fmean(cpu[0]), statistics.fmean(cpu[1])
    fixed = step_fixed_seconds(sizes[0], full_cpu, sizes[1], half_cpu) / full_cpu if full_cpu > 0 else 0.0
    return batch_rows / step, step * fixed


def make_probe(config: TrainConfig, num_features: int, num_outputs: int, inputs: InputSpec | None,
               batch_rows: int, launched_at: float):
    """The barrier task function: every rank measures at the same time (so they contend for the hosts as
    they will in training: the stage starts them together, and no `barrier()` is waited for, which would cost
    Spark's barrier round trip, most of a second) and returns one row: {"rank", "host", "rows_per_s", "fixed_s",
    "executor" (the task's address, which tells executors on one host apart), "start_s"}: from `launched_at`
    (time.time() as the driver submits the stage) to the function's first line: Spark's scheduling, the Python
    worker's fork and its imports of blocksync and torch, which a reused worker does not pay again in training."""

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        start_s = time.time() - launched_at
        from pyspark import BarrierTaskContext

        for _ in batches:
            pass
        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        threads = config.threads_per_worker or max(1, int(ctx.cpus()) if hasattr(ctx, "cpus") else 1)
        torch.set_num_threads(threads)
        rate, fixed = probe_costs(config, num_features, num_outputs, inputs, batch_rows, rank)
        fact: dict[str, Any] = {"rank": rank, "host": socket.gethostname(), "rows_per_s": rate, "fixed_s": fixed,
                                "executor": ctx.getTaskInfos()[rank].address, "start_s": start_s}
        yield pa.RecordBatch.from_pylist([{"payload": json.dumps(fact)}])

    return probe
