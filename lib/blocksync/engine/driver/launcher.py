"""Driver side: validate, cut blocks, run the one barrier stage, reassemble the result.

The driver's side of the protocol, step by step, is `train_blocks`'s docstring; what every rank does
in the barrier stage is `engine.worker.worker.make_worker`'s.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from pyspark.sql import DataFrame, SparkSession

from blocksync.engine import checkpoint
from blocksync.engine.comm.collectives import HOROVOD_DEFAULT_FUSION_MB, import_horovod
from blocksync.engine.config import TrainConfig
from blocksync.engine.driver.backend_choice import resolve_backend
from blocksync.engine.driver.balancing import Balance, cutter
from blocksync.engine.driver.blocks import FEATURES, WEIGHT, BlockInfo, label_aggregates, label_facts, make_blocks
from blocksync.engine.driver.input_columns import resolve_inputs
from blocksync.engine.driver.metrics import run_metrics
from blocksync.engine.driver.scan import parquet_scan_files
from blocksync.engine.driver.shards import plan_shards
from blocksync.engine.driver.spark_facts import is_connect, is_local
from blocksync.engine.driver.storage import resolve_chunks, resolve_storage, worker_memory
from blocksync.engine.errors import CollectiveError, TrainingError
from blocksync.engine.inputs import Input, InputSpec
from blocksync.engine.losses import check_loss
from blocksync.engine.models import build_model, module_from_bytes, validate_spec
from blocksync.engine.plan import ShardPlan, WorkerPlan
from blocksync.engine.progress import RunMonitor
from blocksync.engine.worker import startup
from blocksync.engine.worker.block_data import steps_per_epoch
from blocksync.engine.worker.block_store import storage_width
from blocksync.engine.worker.worker import RESULT_SCHEMA_DDL, make_worker

log = logging.getLogger(__name__)


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
    inputs: InputSpec | None = None
    """The typed inputs as trained (widths and cardinalities measured); None: one feature matrix."""


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
    if is_local(spark):
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
    if config.faults.kill_rank is not None and config.faults.mode == "executor" and is_local(spark):
        raise ValueError(
            "faults.mode=executor kills the rank's executor JVM, which in local mode is the driver itself; "
            "use a cluster master (standalone, YARN, Kubernetes) or faults.mode=exit."
        )


def resolve_outputs(config: TrainConfig, blocks: DataFrame, info: BlockInfo) -> int:
    if config.task == "regression":
        return 1
    # make_blocks counted these on its own pass; scanning `blocks` again would recompute its shuffle.
    return outputs_from_labels(config, info.labels or label_facts(blocks.agg(*label_aggregates()).collect()))


def outputs_from_labels(config: TrainConfig, labels: tuple[float, float, int]) -> int:
    """Classification's output width from (min, max, non-integer count) of the labels, checked."""
    if config.task == "regression":
        return 1
    lo, hi, fractional = labels
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


_RANK_LINE = re.compile(r"\[blocksync rank \d+ kind=(input|runtime)\][^\n]*")
_PY_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(.*?)(?:\n\s+at [\w$.]+\(|\Z)", re.S)
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def worker_error(err: BaseException, monitor: RunMonitor | None = None) -> TrainingError:
    """The failing worker's own error line(s) out of Spark's wrapped exception text.

    A stall or a dead Python worker leaves no exception text of its own; the
    run monitor's account of it comes first then. A failure before the worker
    function ran (the executors' Python cannot unpickle it) leaves a plain
    Python traceback inside the Java one: its last line is the cause.
    """
    failure = monitor.failure_text() if monitor is not None else None
    if failure and monitor is not None:  # the first event: later errors of other ranks are its consequences
        return TrainingError(f"training failed: {failure}", monitor.failure_kind)
    text = str(err)
    # The kind tag is for the driver; the user reads "[blocksync rank R] Type: message".
    ranked = list(dict.fromkeys(re.sub(r" kind=\w+\]", "]", m.group(0)) for m in _RANK_LINE.finditer(text)))
    if ranked:
        kind = "input" if any(m.group(1) == "input" for m in _RANK_LINE.finditer(text)) else "runtime"
        return TrainingError("training failed: " + " | ".join(ranked[:4]), kind)
    missing = _MISSING_MODULE.search(text)
    if missing:
        return TrainingError(
            f"the executors' Python cannot import {missing.group(1)!r} (ModuleNotFoundError), so no worker "
            "started. Point spark.pyspark.python (or PYSPARK_PYTHON) at a Python where blocksync and its "
            "dependencies are installed on every executor, or ship them: a blocksync wheel with --py-files "
            "(pure Python) and an environment archive with spark.archives for torch and the rest.",
            "input",
        )
    traceback = _PY_TRACEBACK.search(text)
    if traceback:
        cause = [ln for ln in traceback.group(1).splitlines() if ln.strip() and not ln.startswith(" ")]
        if cause:
            return TrainingError(f"training failed on an executor before the worker started: {cause[-1][:1500]}")
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
    validation: str | None = None,
    weight: str | None = None,
    inputs: Sequence[Input | dict[str, Any]] | None = None,
) -> TrainResult:
    """Train `config.model` on `df` by block-synchronous data parallelism.

    `features` names an array<float> column, an ML vector column, or a list of
    numeric columns; or `inputs` lists typed inputs instead (numeric, tokens,
    categorical; see `blocksync.engine.inputs`), which the model receives as a
    dict of tensors; `label` a numeric column (class index or target); `weight`
    an optional numeric column of per-row weights (finite, >= 0): each step then
    minimizes the weighted sum of the rows' losses over the global batch divided
    by the batch's summed weights, exactly as one process would.
    `progress`: "bar" (tqdm on stderr, fed by rank 0 during the stage), "log"
    (a log line per epoch) or "off". `validation` names a boolean column whose
    true rows are held out for the per-epoch validation loss (instead of
    `config.validation_fraction`).
    """
    if inputs is not None and features != FEATURES:
        raise ValueError(f"both features={features!r} and inputs were given; typed inputs name their own columns: "
                         "pass one of them.")
    if config.blocks == "files":
        raise ValueError(
            "blocks=files reads Parquet files directly, so it needs their path: call "
            "train_files(spark, path, config), or set blocks=shuffle to train on a DataFrame."
        )
    if validation is not None and config.validation_fraction > 0:
        raise ValueError(f"both a validation column ({validation!r}) and validation_fraction="
                         f"{config.validation_fraction} were given; use one of them.")
    if config.early_stopping_patience and validation is None and not config.validation_fraction:
        raise ValueError(f"early_stopping_patience={config.early_stopping_patience} needs validation rows: set "
                         "validation_fraction, or pass a validation column.")
    if config.blocks == "auto" and validation is None and not config.validation_fraction and inputs is None:
        names = [*([features] if isinstance(features, str) else features), label, *([weight] if weight else [])]
        files = parquet_scan_files(df, names)
        if files is not None:
            log.info("the DataFrame is a plain scan of %d Parquet file(s): each worker reads its rows of them "
                     "(blocks=auto chose files: no shuffle)", len(files))
            return train_files(spark, files, config, features=features, label=label, progress=progress,
                               weight=weight)
    refuse_weighted_custom_loss(config, weight is not None)
    check_slots(spark, config.num_workers)
    spec = resolve_inputs(df, inputs) if inputs is not None else None
    if spec is not None:  # the model before the shuffle; train_blocks checks its outputs against the labels
        validate_spec(config.model, spec.float_width, 1 if config.task == "regression" else config.num_classes or 2,
                      spec)
    chosen: list[Balance] = []
    blocks, info = make_blocks(df, features=features, label=label, num_workers=config.num_workers, seed=config.seed,
                               validation_col=validation, validation_fraction=config.validation_fraction,
                               weight=weight, inputs=spec, cut=_cut(spark, config, chosen))
    return train_blocks(spark, blocks, info, config, progress=progress, balance=chosen[0] if chosen else None)


def _cut(spark: SparkSession, config: TrainConfig, chosen: list[Balance]):
    """balance=speed: the callback that sizes the blocks by measured speed (`balancing.cutter`); even: None."""
    if config.balance != "speed":
        return None
    return cutter(spark, config, lambda labels: outputs_from_labels(config, labels), chosen)


def train_files(
    spark: SparkSession,
    paths: str | list[str],
    config: TrainConfig,
    *,
    features: str | list[str] = "features",
    label: str = "label",
    progress: str = "off",
    weight: str | None = None,
) -> TrainResult:
    """Like `train`, on Parquet files (a folder, a file or a list; any pyarrow filesystem URI) that
    every worker reads its own balanced row range of, without a Spark shuffle (see `shards`).

    The files must be readable from every executor at the same path (a shared or
    object-store filesystem on a cluster). `config.blocks` is ignored here.
    """
    if config.validation_fraction or config.early_stopping_patience:
        raise ValueError("validation_fraction and early_stopping_patience need blocks cut by Spark: call "
                         "train(spark, df, config) (blocks=shuffle), or set them to 0.")
    refuse_weighted_custom_loss(config, weight is not None)
    check_slots(spark, config.num_workers)
    chosen: list[Balance] = []
    shards, info = plan_shards(spark, paths, features=features, label=label, num_workers=config.num_workers,
                               weight=weight, cut=_cut(spark, config, chosen))
    # One empty partition per rank: the barrier stage needs N tasks, and each reads its own rows.
    ranks = spark.range(config.num_workers, numPartitions=config.num_workers)
    return train_blocks(spark, ranks, info, config, progress=progress, shards=shards,
                        balance=chosen[0] if chosen else None)


def train_blocks(
    spark: SparkSession,
    blocks: DataFrame,
    info: BlockInfo,
    config: TrainConfig,
    *,
    progress: str = "off",
    shards: ShardPlan | None = None,
    balance: Balance | None = None,
) -> TrainResult:
    """Train on a DataFrame already cut into `num_workers` partitions of (features, label).

    `train` calls this after `make_blocks`; callers with their own partitioning
    (tests of unequal blocks, for one) may call it directly. With `shards`
    (from `train_files`), each task reads its block from files instead.

    Protocol, from the driver's point of view:

    1. Validate the config and the cluster: `num_workers` must fit in the task
       slots the cluster has *now* (Spark would otherwise wait minutes and then
       fail a barrier stage), the feature and label columns must exist and be
       numeric, the data must hold at least one row per worker.
    2. `blocks.make_blocks`: exactly `num_workers` balanced partitions, seeded; or,
       with `train_files`, or `train` given a plain Parquet scan under blocks=auto
       (`scan.parquet_scan_files`), `shards.plan_shards`: a balanced row range of
       the Parquet files per rank, which each worker reads itself (no shuffle).
    3. Fix the schedule before launch: steps per epoch = ceil(rows / batch_size),
       the same for every worker (see `worker` for the per-step protocol); and
       where blocks are kept (`storage`: memory or the executors' local disk),
       refusing a block that cannot fit before any worker starts.
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
    config = resolve_backend(spark, config)
    num_partitions = blocks.rdd.getNumPartitions() if not is_connect(spark) else None
    if num_partitions is not None and num_partitions != config.num_workers:
        raise ValueError(
            f"the blocks DataFrame has {num_partitions} partitions but num_workers={config.num_workers}; "
            "use make_blocks or repartition to num_workers."
        )
    if config.balance == "speed" and balance is None:
        raise ValueError("balance=speed sizes the blocks as train or train_files cuts them; blocks cut by the "
                         "caller cannot follow it: call train or train_files, or set balance=even.")
    check_horovod_knobs(spark, config)
    check_fault_mode(spark, config)
    num_outputs = resolve_outputs(config, blocks, info)
    validate_spec(config.model, info.num_features, num_outputs, info.inputs)
    if config.loss:
        check_loss(config.loss, config.task, num_outputs)
    total_rows = sum(info.sizes)
    per_epoch = steps_per_epoch(total_rows, config.batch_size)
    id_width = info.inputs.id_width if info.inputs is not None else 0
    weighted = (shards.weight is not None) if shards else WEIGHT in blocks.columns
    width = storage_width(info.num_features, id_width, 2 if weighted else 1)
    storage = resolve_storage(config, info.sizes, width, per_epoch, worker_memory(spark, config.num_workers),
                              has_files=shards is not None)
    chunks = resolve_chunks(config, info.sizes, width, per_epoch, storage,
                            shards.largest_group_bytes if shards is not None else 0)
    plan = WorkerPlan(
        config=config,
        num_features=info.num_features,
        num_outputs=num_outputs,
        total_rows=total_rows,
        steps_per_epoch=per_epoch,
        shards=shards,
        block_rows=list(info.sizes),
        val_rows=list(info.val_sizes) if info.val_sizes is not None else None,
        storage=storage,
        chunks=chunks,
        weighted=weighted,
        inputs=info.inputs,
        balance=balance.to_dict() if balance is not None else None,
    )
    refuse_weighted_custom_loss(config, plan.weighted)
    check_checkpoint(config, info.num_features, num_outputs, info.inputs)
    log.info(
        "training %s on %d rows in %d blocks (%s), backend=%s, %d steps",
        config.model.name, total_rows, config.num_workers, storage, config.backend, plan.total_steps,
    )
    started = time.perf_counter()
    rows = _launch_with_restarts(spark, blocks, plan, progress)
    wall_seconds = time.perf_counter() - started
    result = _assemble(config, plan, info, rows, wall_seconds)
    if balance is not None and result.metrics["startup_phases"]:
        phases = result.metrics["startup_phases"]  # the probe ran on the driver's side, before the launch
        phases["probe_s"], phases["probe_start_s"] = balance.probe_seconds, balance.probe_start_seconds
    log.info("%s", startup.describe(result.metrics["startup_phases"]))
    return result


def refuse_weighted_custom_loss(config: TrainConfig, weighted: bool) -> None:
    if weighted and config.loss:
        raise ValueError(f"loss={config.loss!r} with per-row weights: a custom loss sums its own rows, so it "
                         "cannot weight them; unset the weight column, or weight the rows inside the loss.")


def check_checkpoint(config: TrainConfig, num_features: int, num_outputs: int, inputs: InputSpec | None = None) -> None:
    """Before launch: the checkpoint a run would resume from must load and fit the model."""
    path = checkpoint.latest(config.checkpoint.dir)
    if path is None:
        return
    snapshot = checkpoint.read(path)
    checkpoint.check_shard_mode(snapshot, config.shard, path)
    checkpoint.check_compatible(snapshot, build_model(config.model, num_features, num_outputs, inputs), path)
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
                                 stall_seconds=config.timeouts.step_seconds, num_ranks=config.num_workers,
                                 startup_seconds=config.timeouts.barrier_seconds,
                                 on_stall=partial(spark.sparkContext.cancelJobsWithTag, tag))
            spark.sparkContext.addJobTag(tag)
        if attempt and classic:
            # A lost executor takes its slots with it until the cluster manager replaces it.
            check_slots(spark, config.num_workers, wait_seconds=RELAUNCH_SLOT_WAIT_SECONDS)
        run_plan = replace(plan, attempt=attempt, resume_from=checkpoint.latest(config.checkpoint.dir),
                           launched_at=time.time(),
                           monitor_address=monitor.address if monitor else None)
        try:
            return blocks.mapInArrow(make_worker(run_plan), RESULT_SCHEMA_DDL, barrier=True).collect()
        except Exception as err:
            failure = worker_error(err, monitor)
            if failure.kind == "input" or attempt == config.max_restarts:
                restarts = f" (after {attempt} restart(s))" if attempt else ""
                raise TrainingError(f"{failure}{restarts}", failure.kind) from err
            log.warning("attempt %d of %d failed: %s; relaunching from %s", attempt + 1, config.max_restarts + 1,
                        failure, checkpoint.latest(config.checkpoint.dir) or "the start (no checkpoint)")
        finally:
            if monitor is not None:
                monitor.close()
                spark.sparkContext.removeJobTag(tag)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _assemble(config: TrainConfig, plan: WorkerPlan, info: BlockInfo, rows: list[Any], wall: float) -> TrainResult:
    chunks = sorted((r["seq"], r["payload"]) for r in rows if r["kind"] == "model")
    summaries = sorted((json.loads(r["payload"]) for r in rows if r["kind"] == "summary"), key=lambda s: s["rank"])
    if not chunks or len(summaries) != config.num_workers:
        raise TrainingError(
            f"the barrier stage returned {len(chunks)} model chunks and {len(summaries)} of "
            f"{config.num_workers} rank summaries"
        )
    model = module_from_bytes(config.model, plan.num_features, plan.num_outputs,
                              b"".join(bytes(p) for _, p in chunks), plan.inputs)
    return TrainResult(
        model=model,
        config=config,
        num_features=plan.num_features,
        num_outputs=plan.num_outputs,
        block_sizes=[s["rows"] for s in summaries],
        metrics=run_metrics(config, plan, summaries, wall),
        history=summaries[0]["history"],
        rank_summaries=summaries,
        inputs=plan.inputs,
    )
