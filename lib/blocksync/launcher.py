"""Driver side: validate, cut blocks, run the one barrier stage, reassemble the result.

Protocol, from the driver's point of view:

1. Validate the config and the cluster: `num_workers` must fit in the task
   slots the cluster has *now* (Spark would otherwise wait minutes and then
   fail a barrier stage), the feature and label columns must exist and be
   numeric, the data must hold at least one row per worker.
2. `blocks.make_blocks`: exactly `num_workers` balanced partitions, seeded; or,
   with `train_files`, `shards.plan_shards`: a balanced row range of the
   Parquet files per rank, which each worker reads itself (no shuffle).
3. Fix the schedule before launch: steps per epoch = ceil(rows / batch_size),
   the same for every worker (see `worker` for the per-step protocol).
4. One barrier stage: `blocks.mapInArrow(worker, schema, barrier=True)`. Never
   one Spark job per step: Spark scheduling costs far more than a step.
5. Collect: rank 0's state_dict chunks are joined in order and loaded with
   safetensors; every rank's timing summary becomes the run's metrics.
6. A failed stage becomes a `TrainingError` carrying the root cause: the
   failing rank's own error, a stall or a dead Python worker as the run
   monitor saw it; never a bare Py4JJavaError. Spark does not retry a failed
   barrier stage, so the driver relaunches it up to `max_restarts` times, each
   time resuming from the newest checkpoint; user errors are not retried.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from pyspark.sql import DataFrame, SparkSession

from blocksync import checkpoint
from blocksync.block_data import steps_per_epoch
from blocksync.blocks import BlockInfo, label_aggregates, label_facts, make_blocks
from blocksync.collectives import HOROVOD_DEFAULT_FUSION_MB, CollectiveError, import_horovod
from blocksync.config import TrainConfig
from blocksync.models import build_model, validate_spec
from blocksync.progress import RunMonitor
from blocksync.report import PHASES
from blocksync.shards import ShardPlan, plan_shards
from blocksync.worker import RESULT_SCHEMA_DDL, WorkerPlan, make_worker

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """The barrier stage failed; the message carries the worker's own error and rank."""


@dataclass
class TrainResult:
    """What `train` returns: the trained model (on CPU) and what the run measured."""

    model: torch.nn.Module
    config: TrainConfig
    num_features: int
    num_outputs: int
    block_sizes: list[int]
    metrics: dict[str, Any]
    history: list[dict[str, float]]
    rank_summaries: list[dict[str, Any]] = field(repr=False)


def is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def task_slots(spark: SparkSession) -> int | None:
    """Barrier tasks the cluster can run at once now, as Spark's own check counts them."""
    if is_connect(spark):
        return None  # no SparkContext on a Connect client; Spark's own check applies
    sc = spark.sparkContext
    jsc = sc._jsc.sc()  # type: ignore[attr-defined]
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # older/other Spark: fall back to cores / task.cpus
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        return sc.defaultParallelism // cpus


RELAUNCH_SLOT_WAIT_SECONDS = 120.0


def check_slots(spark: SparkSession, num_workers: int, wait_seconds: float = 30.0) -> None:
    """Fail fast and clearly when the barrier stage cannot get `num_workers` slots.

    On a cluster, executors may still be registering: wait up to `wait_seconds`.
    In local mode the slots are fixed, so there is nothing to wait for.
    """
    if not is_connect(spark) and (spark.sparkContext.master or "").startswith("local"):
        wait_seconds = 0.0
    deadline = time.monotonic() + wait_seconds
    slots = task_slots(spark)
    while slots is not None and slots < num_workers and time.monotonic() < deadline:
        time.sleep(1.0)  # executors may still be registering
        slots = task_slots(spark)
    if slots is not None and slots < num_workers:
        raise ValueError(
            f"num_workers={num_workers} but the cluster has {slots} task slots; "
            "lower num_workers or add executors/cores (a barrier stage needs all its tasks at once)."
        )


def check_fault_mode(spark: SparkSession, config: TrainConfig) -> None:
    """faults.mode=executor kills the executor JVM; in local mode that JVM is the driver."""
    if config.faults.kill_rank is None or config.faults.mode != "executor" or is_connect(spark):
        return
    if (spark.sparkContext.master or "").startswith("local"):
        raise ValueError(
            "faults.mode=executor kills the rank's executor JVM, which in local mode is the driver itself; "
            "use a cluster master (standalone, YARN, Kubernetes) or faults.mode=exit."
        )


def resolve_outputs(config: TrainConfig, blocks: DataFrame, info: BlockInfo) -> int:
    if config.task == "regression":
        return 1
    # make_blocks counted these on its own pass; scanning `blocks` again would recompute its shuffle.
    lo, hi, fractional = info.labels or label_facts(blocks.agg(*label_aggregates()).collect())
    if fractional or lo < 0:
        raise ValueError(
            f"classification labels must be class indices 0..K-1 (found min {lo:g}, "
            f"{fractional} non-integer); map classes to indices or set task=regression."
        )
    num_classes = config.num_classes or int(hi) + 1
    if hi >= num_classes:
        raise ValueError(
            f"num_classes={num_classes} but labels go up to {int(hi)}; raise num_classes or leave it null."
        )
    return max(num_classes, 2)


def check_horovod_knobs(spark: SparkSession, config: TrainConfig) -> None:
    if config.backend != "horovod":
        return
    try:  # the driver shares the executors' environment in local and single-image deployments
        import_horovod()
    except CollectiveError as err:
        raise ValueError(str(err)) from err
    if config.horovod.fusion_threshold_mb == HOROVOD_DEFAULT_FUSION_MB:
        return
    if (spark.conf.get("spark.python.worker.reuse", "true") or "true").lower() != "false":
        raise ValueError(
            f"horovod.fusion_threshold_mb={config.horovod.fusion_threshold_mb} needs "
            "spark.python.worker.reuse=false: Horovod 0.28.1 crashes when a reused Python worker initializes it "
            "again after a custom fusion threshold. Set that Spark option or keep the default 128."
        )


_RANK_LINE = re.compile(r"\[blocksync rank \d+\][^\n]*")


def worker_error(err: BaseException, monitor_failure: str | None = None) -> TrainingError:
    """The failing worker's own error line(s) out of Spark's wrapped exception text.

    A stall or a dead Python worker leaves no exception text of its own; the
    run monitor's account of it comes first then.
    """
    if monitor_failure:  # the first event: later errors of other ranks are its consequences
        return TrainingError(f"training failed: {monitor_failure}")
    text = str(err)
    lines = list(dict.fromkeys(_RANK_LINE.findall(text)))
    if lines:
        return TrainingError("training failed: " + " | ".join(lines[:4]))
    tail = [ln for ln in text.splitlines() if ln.strip()][-3:]
    return TrainingError("training failed in the barrier stage: " + " ".join(tail)[:2000])


def train(
    spark: SparkSession,
    df: DataFrame,
    config: TrainConfig,
    *,
    features: str | list[str] = "features",
    label: str = "label",
    progress: str = "off",
) -> TrainResult:
    """Train `config.model` on `df` by block-synchronous data parallelism.

    `features` names an array<float> column, an ML vector column, or a list of
    numeric columns; `label` a numeric column (class index or target).
    `progress`: "bar" (tqdm on stderr, fed by rank 0 during the stage), "log"
    (a log line per epoch) or "off".
    """
    if config.blocks == "files":
        raise ValueError(
            "blocks=files reads Parquet files directly, so it needs their path: call "
            "train_files(spark, path, config), or set blocks=shuffle to train on a DataFrame."
        )
    check_slots(spark, config.num_workers)
    blocks, info = make_blocks(df, features=features, label=label, num_workers=config.num_workers, seed=config.seed)
    return train_blocks(spark, blocks, info, config, progress=progress)


def train_files(
    spark: SparkSession,
    paths: str | list[str],
    config: TrainConfig,
    *,
    features: str | list[str] = "features",
    label: str = "label",
    progress: str = "off",
) -> TrainResult:
    """Like `train`, on Parquet files (a folder, a file or a list; any pyarrow filesystem URI) that
    every worker reads its own balanced row range of, without a Spark shuffle (see `shards`).

    The files must be readable from every executor at the same path (a shared or
    object-store filesystem on a cluster). `config.blocks` is ignored here.
    """
    check_slots(spark, config.num_workers)
    shards, info = plan_shards(spark, paths, features=features, label=label, num_workers=config.num_workers)
    # One empty partition per rank: the barrier stage needs N tasks, and each reads its own rows.
    ranks = spark.range(config.num_workers, numPartitions=config.num_workers)
    return train_blocks(spark, ranks, info, config, progress=progress, shards=shards)


def train_blocks(
    spark: SparkSession,
    blocks: DataFrame,
    info: BlockInfo,
    config: TrainConfig,
    *,
    progress: str = "off",
    shards: ShardPlan | None = None,
) -> TrainResult:
    """Train on a DataFrame already cut into `num_workers` partitions of (features, label).

    `train` calls this after `make_blocks`; callers with their own partitioning
    (tests of unequal blocks, for one) may call it directly. With `shards`
    (from `train_files`), each task reads its block from files instead.
    """
    num_partitions = blocks.rdd.getNumPartitions() if not is_connect(spark) else None
    if num_partitions is not None and num_partitions != config.num_workers:
        raise ValueError(
            f"the blocks DataFrame has {num_partitions} partitions but num_workers={config.num_workers}; "
            "use make_blocks or repartition to num_workers."
        )
    check_horovod_knobs(spark, config)
    check_fault_mode(spark, config)
    num_outputs = resolve_outputs(config, blocks, info)
    validate_spec(config.model, info.num_features, num_outputs)
    total_rows = sum(info.sizes)
    per_epoch = steps_per_epoch(total_rows, config.batch_size)
    plan = WorkerPlan(
        config=config,
        num_features=info.num_features,
        num_outputs=num_outputs,
        total_rows=total_rows,
        steps_per_epoch=per_epoch,
        shards=shards,
    )
    check_checkpoint(config, info.num_features, num_outputs)
    log.info(
        "training %s on %d rows in %d blocks, backend=%s, %d steps",
        config.model.name, total_rows, config.num_workers, config.backend, plan.total_steps,
    )
    started = time.perf_counter()
    rows = _launch_with_restarts(spark, blocks, plan, progress)
    wall_seconds = time.perf_counter() - started
    return _assemble(config, plan, info, rows, wall_seconds)


def check_checkpoint(config: TrainConfig, num_features: int, num_outputs: int) -> None:
    """Before launch: the checkpoint a run would resume from must load and fit the model."""
    path = checkpoint.latest(config.checkpoint.dir)
    if path is None:
        return
    snapshot = checkpoint.read(path)
    checkpoint.check_compatible(snapshot, build_model(config.model, num_features, num_outputs), path)
    log.info("will resume from %s (step %d)", path, snapshot.step)


def _launch_with_restarts(spark: SparkSession, blocks: DataFrame, plan: WorkerPlan, progress: str) -> list[Any]:
    """Run the barrier stage; after a worker failure or stall, relaunch up to max_restarts times.

    Spark does not retry a failed barrier ResultStage, so the driver does: each
    relaunch resumes every worker from the latest checkpoint (or from scratch
    without one). Errors in the user's data or settings are not retried.
    """
    config = plan.config
    classic = not is_connect(spark)
    if not classic:
        log.warning(
            "Spark Connect session: no SparkContext on the client, so no live progress, stall watchdog or "
            "task-slot check; Spark's own barrier checks and the Gloo timeouts apply."
        )
    host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1") if classic else None
    for attempt in range(config.max_restarts + 1):
        tag = f"blocksync-{uuid.uuid4().hex[:12]}"
        monitor = None
        if classic and host:
            monitor = RunMonitor(host, plan.total_steps, show_bar=progress == "bar", log_epochs=progress == "log",
                                 stall_seconds=config.timeouts.step_seconds,
                                 on_stall=partial(spark.sparkContext.cancelJobsWithTag, tag))
            spark.sparkContext.addJobTag(tag)
        if attempt and classic:
            # A lost executor takes its slots with it until the cluster manager replaces it.
            check_slots(spark, config.num_workers, wait_seconds=RELAUNCH_SLOT_WAIT_SECONDS)
        run_plan = replace(plan, attempt=attempt, resume_from=checkpoint.latest(config.checkpoint.dir),
                           monitor_address=monitor.address if monitor else None)
        try:
            return blocks.mapInArrow(make_worker(run_plan), RESULT_SCHEMA_DDL, barrier=True).collect()
        except Exception as err:
            failure = worker_error(err, monitor.failure if monitor else None)
            if _is_user_error(failure) or attempt == config.max_restarts:
                restarts = f" (after {attempt} restart(s))" if attempt else ""
                raise TrainingError(f"{failure}{restarts}") from err
            log.warning("attempt %d of %d failed: %s; relaunching from %s", attempt + 1, config.max_restarts + 1,
                        failure, checkpoint.latest(config.checkpoint.dir) or "the start (no checkpoint)")
        finally:
            if monitor is not None:
                monitor.close()
                spark.sparkContext.removeJobTag(tag)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _is_user_error(failure: TrainingError) -> bool:
    return any(kind in str(failure) for kind in ("] ValueError:", "] CheckpointError:", "] CollectiveError:"))


def _assemble(config: TrainConfig, plan: WorkerPlan, info: BlockInfo, rows: list[Any], wall: float) -> TrainResult:
    from safetensors.torch import load

    chunks = sorted((r["seq"], r["payload"]) for r in rows if r["kind"] == "model")
    summaries = sorted((json.loads(r["payload"]) for r in rows if r["kind"] == "summary"), key=lambda s: s["rank"])
    if not chunks or len(summaries) != config.num_workers:
        raise TrainingError(
            f"the barrier stage returned {len(chunks)} model chunks and {len(summaries)} of "
            f"{config.num_workers} rank summaries"
        )
    state = load(b"".join(bytes(p) for _, p in chunks))
    model = build_model(config.model, plan.num_features, plan.num_outputs)
    model.load_state_dict(state)
    model.eval()
    return TrainResult(
        model=model,
        config=config,
        num_features=plan.num_features,
        num_outputs=plan.num_outputs,
        block_sizes=[s["rows"] for s in summaries],
        metrics=run_metrics(config, plan, summaries, wall),
        history=summaries[0]["history"],
        rank_summaries=summaries,
    )


def timing_summary(summaries: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """p50 and p95 milliseconds of each phase, per rank."""
    out: dict[str, dict[str, float]] = {}
    for s in summaries:
        t = np.asarray(s["step_timings"], dtype=np.float64).reshape(-1, 5)
        row: dict[str, float] = {}
        for i, phase in enumerate(PHASES, start=1):
            row[f"{phase}_p50_ms"] = float(np.percentile(t[:, i], 50) * 1000)
            row[f"{phase}_p95_ms"] = float(np.percentile(t[:, i], 95) * 1000)
        out[str(s["rank"])] = row
    return out


def find_stragglers(timing: dict[str, dict[str, float]], factor: float, min_ms: float) -> list[int]:
    """Ranks whose median compute time exceeds the median over ranks by `factor` and by `min_ms`."""
    p50 = {int(r): t["compute_p50_ms"] for r, t in timing.items()}
    typical = statistics.median(p50.values())
    return sorted(r for r, v in p50.items() if v > factor * typical and v - typical > min_ms)


def run_metrics(config: TrainConfig, plan: WorkerPlan, summaries: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Throughput, the share of step time spent in the collective, bytes, stragglers, from every rank's timings."""
    # step_timings rows: start, data, compute, sync, optimizer (seconds)
    step_time = [sum(sum(t[1:]) for t in s["step_timings"]) for s in summaries]
    sync_time = [sum(t[3] for t in s["step_timings"]) for s in summaries]
    train_seconds = max(s["train_seconds"] for s in summaries)
    samples = plan.total_rows * config.epochs
    timing = timing_summary(summaries)
    stragglers = find_stragglers(timing, config.straggler_factor, config.straggler_min_ms)
    if stragglers:
        log.warning("straggler rank(s) %s: median compute above %.1fx the ranks' median", stragglers,
                    config.straggler_factor)
    return {
        "epochs": config.epochs,
        "steps": plan.total_steps,
        "num_workers": config.num_workers,
        "backend": config.backend,
        "sync": config.sync,
        "compression": config.compression,
        "train_loss": summaries[0]["history"][-1]["train_loss"],
        "samples_per_sec": samples / train_seconds if train_seconds > 0 else float("nan"),
        "train_seconds": train_seconds,
        "stage_seconds": wall,
        "startup_seconds": max(s["startup_seconds"] for s in summaries),
        "sync_fraction": sum(sync_time) / sum(step_time) if sum(step_time) > 0 else 0.0,
        "bytes_sent": sum(s["bytes_sent"] for s in summaries),
        "payload_bytes_per_step": summaries[0]["payload_bytes"] / plan.total_steps,
        "median_step_ms": 1000 * statistics.median(sum(t[1:]) for t in summaries[0]["step_timings"]),
        "timing": timing,
        "stragglers": stragglers,
    }
