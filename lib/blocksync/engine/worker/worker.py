"""Worker side: the function each barrier task runs (one per block, one rank each).

The synchronization protocol, written once for the whole engine, is `make_worker`'s docstring: every rank
runs the same sequence of collectives, so they always match and unequal blocks cannot deadlock.
`engine.driver.launcher` (the driver's side) and `trainer` (the loop) point to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from blocksync.engine.comm.collectives import Collective, Rendezvous, start_collective
from blocksync.engine.comm.sharding import state_bytes as optimizer_bytes
from blocksync.engine.last_words import StderrRelay
from blocksync.engine.models import state_bytes
from blocksync.engine.plan import WorkerPlan
from blocksync.engine.progress import Heartbeat
from blocksync.engine.worker.anon_memory import AnonPeak, status_mb
from blocksync.engine.worker.block_data import batch_arrays, split_targets
from blocksync.engine.worker.block_store import (
    Block,
    DiskBlockWriter,
    MemoryBlock,
    block_too_large,
    check_block_fits,
    storage_width,
)
from blocksync.engine.worker.placement import block_of_rank, task_addresses
from blocksync.engine.worker.shard_reader import iter_pieces
from blocksync.engine.worker.startup import StartupClock
from blocksync.engine.worker.stream_block import StreamBlock
from blocksync.engine.worker.trainer import Trainer, open_run_feed, params_digest

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
Piece = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Rows as they arrive or are held: (features float32 [k, d], ids int64 [k, i], targets float64)."""
RESULT_SCHEMA = pa.schema(
    [("kind", pa.string()), ("rank", pa.int32()), ("seq", pa.int32()), ("payload", pa.binary())]
)
RESULT_SCHEMA_DDL = "kind string, rank int, seq int, payload binary"


def select_device(requested: str, gpu_addresses: list[str]) -> tuple[torch.device, str | None]:
    """(device, warning). `auto` uses the task's GPU when CUDA works, else the CPU."""
    cuda_ok = torch.cuda.is_available()
    if requested == "cpu":
        return torch.device("cpu"), None
    if requested == "cuda" and not cuda_ok:
        raise RuntimeError("device='cuda' was requested but CUDA is not available in this executor's torch")
    if gpu_addresses and cuda_ok:
        return torch.device(f"cuda:{int(gpu_addresses[0])}"), None
    if requested == "cuda":
        return torch.device("cuda"), None
    if gpu_addresses:
        return torch.device("cpu"), f"Spark assigned GPU {gpu_addresses} but CUDA is unavailable; training on CPU"
    return torch.device("cpu"), None


def _state_chunks(model: torch.nn.Module) -> Iterator[bytes]:
    blob = state_bytes(model)
    for start in range(0, len(blob), CHUNK_BYTES):
        yield blob[start : start + CHUNK_BYTES]


def _rows(kind: str, rank: int, payloads: list[bytes]) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_arrays(
        [pa.array([kind] * n), pa.array([rank] * n, pa.int32()), pa.array(range(n), pa.int32()),
         pa.array(payloads, pa.binary())],
        schema=RESULT_SCHEMA,
    )


def _validate_block(plan: WorkerPlan, x: np.ndarray, ids: np.ndarray, targets: np.ndarray) -> str:
    if x.shape[0] and (x.shape[1] != plan.num_features or ids.shape[1] != plan.id_width):
        return (f"block has {x.shape[1]} features and {ids.shape[1]} ids, expected {plan.num_features} and "
                f"{plan.id_width}")
    if not np.isfinite(x).all():
        return f"{int((~np.isfinite(x)).any(axis=1).sum())} rows have NaN or infinite features"
    if plan.inputs is not None and ids.size:  # the driver checked these; a second look costs one comparison
        outside = int(((ids < 0) | (ids >= plan.inputs.id_limits())).any(axis=1).sum())
        if outside:
            return f"{outside} rows hold ids outside their inputs' cardinalities"
    y, w = split_targets(targets)
    if w is not None:
        bad_weights = int((~np.isfinite(w) | (w < 0)).sum())
        if bad_weights:
            return (f"{bad_weights} row weights are negative, NaN or infinite; a weight column holds "
                    "finite numbers >= 0")
    if plan.config.task == "classification" and y.size:
        bad = (y < 0) | (y >= plan.num_outputs) | (y != np.floor(y))
        if bad.any():
            return f"{int(bad.sum())} labels are not class indices in [0, {plan.num_outputs})"
    return ""


def error_kind(err: BaseException) -> str:
    """`input` for bad data or settings (ValueError and its kin: checkpoint, divergence), else `runtime`."""
    return "input" if isinstance(err, ValueError) else "runtime"


def run_worker(plan: WorkerPlan, batches: Iterator[pa.RecordBatch], ctx: Any) -> Iterator[pa.RecordBatch]:
    clock = StartupClock(plan.launched_at, time.time())
    cfg = plan.config
    rank = ctx.partitionId()
    beat = Heartbeat(plan.monitor_address, rank)
    relay = StderrRelay(plan.monitor_address, rank)  # a native abort's message reaches the driver
    finished, error, kind = False, None, "runtime"
    anon = AnonPeak()
    try:
        threads = cfg.threads_per_worker or max(1, int(ctx.cpus()) if hasattr(ctx, "cpus") else 1)
        torch.set_num_threads(threads)
        gpus = list(ctx.resources()["gpu"].addresses) if "gpu" in ctx.resources() else []
        device, warning = select_device(cfg.device, gpus)
        if warning:
            log.warning("rank %d: %s", rank, warning)
        reset_peak_rss()
        t0 = time.perf_counter()
        blocks = block_of_rank(plan, task_addresses(ctx))  # balance=speed, files: the block cut for my executor
        if plan.balance:
            plan = replace(plan, balance={**plan.balance, "block_of_rank": blocks})  # saved with checkpoints
        held_out: list[Piece] = []
        block, problem = _load_block(plan, batches, blocks[rank], device, held_out)
        validation = _validation_set(plan, held_out, device)
        facts = {"load_seconds": time.perf_counter() - t0, "threads": threads, "gpu_addresses": gpus,
                 "device_warning": warning, "block_storage": plan.storage, "block": blocks[rank]}
        clock.mark("loaded")
        # A fresh run's first window is read while the ranks rendezvous (a resumed run starts where its
        # checkpoint says, which the trainer reads).
        feed = open_run_feed(plan, block, rank, device, 0) if not problem and not plan.resume_from else None
        try:
            beat.at(0, "startup")
            t0 = time.perf_counter()
            coll, rows = _agree_and_connect(plan, ctx, block.rows, problem)
            facts["startup_seconds"] = time.perf_counter() - t0
            clock.mark("connected")
            try:
                trainer = Trainer(plan, coll, block, rows, device, beat, validation)
                if plan.resume_from:
                    trainer.resume(plan.resume_from)
                clock.mark("initialized")
                train_seconds = trainer.run(feed if trainer.rank == rank else None)
                if trainer.first_step_done_at is not None:
                    clock.stamps["first_step"] = trainer.first_step_done_at
                facts.update(train_seconds=train_seconds, startup_phases=clock.phases(), peak_anon_mb=anon.stop())
                yield from _results(trainer, ctx, facts)
                finished = True
            except Exception as err:  # not GeneratorExit: Spark closing the iterator is no error of ours
                # Told before the collective closes: the peers' errors that follow are consequences.
                beat.fail(f"{type(err).__name__}: {err}", error_kind(err))
                raise
            finally:
                coll.close()
        finally:
            if feed is not None:
                feed.close()
            block.close()
    except BaseException as err:
        error, kind = f"{type(err).__name__}: {err}", error_kind(err)
        raise
    finally:
        anon.stop()
        beat.close(done=finished, error=error, kind=kind)
        relay.close()


def _load_block(plan: WorkerPlan, batches: Iterator[pa.RecordBatch], index: int, device: torch.device,
                held_out: list[Piece]) -> tuple[Block, str]:
    """(block, problem): block `index` (the rank's own, or with blocks=files the one `placement` gave it)
    as it arrives, checked piece by piece, into memory or onto disk (`plan.storage`); or an empty block and
    what is wrong with the data. Validation rows (after the block's rows) are appended to `held_out`."""
    expected = plan.block_rows[index] if plan.block_rows else 0
    try:
        pieces = _checked(plan, _incoming(plan, batches, index))
        if plan.val_rows is not None:
            pieces = _split_tail(pieces, expected, held_out)
        if plan.storage == "stream":
            assert plan.shards is not None, "the driver allows stream with blocks=files only"
            for _ in batches:  # the rank's placeholder row (as `_incoming` does)
                pass
            return StreamBlock(plan.shards, index, plan.num_features,
                               lambda x, ids, y: _validate_block(plan, x, ids, y)), ""
        if plan.storage == "disk":
            writer = DiskBlockWriter(plan.num_features, expected, target_columns=plan.target_columns,
                                     id_width=plan.id_width, from_files=plan.shards is not None)
            try:
                for x, ids, y in pieces:
                    writer.append(x, y, ids)
            except BaseException:
                writer.close()
                raise
            return writer.finish(plan.config.memory_budget_mb * 2**20, device), ""
        width = storage_width(plan.num_features, plan.id_width, plan.target_columns)
        check_block_fits(expected, width)  # a cgroup kills without a MemoryError: check first
        try:
            x, ids, y = _fill(pieces, expected, plan)
            return MemoryBlock(x, y, device, ids), ""
        except MemoryError as err:
            raise block_too_large(expected, width) from err
    except ValueError as err:  # bad data in this block: every rank fails with it, none waits
        x, ids, y = _empty(plan, 0)
        return MemoryBlock(x, y, device, ids), str(err)


def _incoming(plan: WorkerPlan, batches: Iterator[pa.RecordBatch], index: int) -> Iterator[Piece]:
    """Block `index`'s rows as they arrive: row groups of its files (blocks=files), or the partition's batches."""
    if plan.shards:
        for _ in batches:  # the rank's placeholder row; Spark reuses a Python worker only after its input ends
            pass
        for x, y in iter_pieces(plan.shards, index, plan.num_features):
            yield x, np.zeros((len(x), 0), np.int64), y
        return
    for batch in batches:
        if batch.num_rows:
            yield batch_arrays(batch)


def _validation_set(plan: WorkerPlan, held_out: list[Piece],
                    device: torch.device) -> tuple[torch.Tensor, ...] | None:
    """This rank's held-out rows as tensors (features, ids, targets; possibly no rows); None when the run
    has no validation."""
    if plan.val_rows is None:
        return None
    arrays = tuple(np.concatenate(parts) for parts in zip(*held_out, strict=True)) if held_out else _empty(plan, 0)
    return tuple(torch.from_numpy(a).to(device) for a in arrays)


def _empty(plan: WorkerPlan, rows: int) -> Piece:
    """Uninitialized (features, ids, targets) for `rows` rows; targets are labels [rows], or (label, weight)
    pairs [rows, 2]."""
    return (np.empty((rows, plan.num_features), np.float32), np.empty((rows, plan.id_width), np.int64),
            np.empty((rows, 2) if plan.weighted else (rows,), dtype=np.float64))


def _split_tail(pieces: Iterator[Piece], keep: int, tail: list[Piece]) -> Iterator[Piece]:
    """The first `keep` rows; the rest (the held-out validation rows) go to `tail` as they arrive."""
    for piece in pieces:
        rows = len(piece[0])
        take = max(0, min(rows, keep))
        keep -= take
        if take:
            yield tuple(a[:take] for a in piece)  # type: ignore[misc]
        if take < rows:
            tail.append(tuple(a[take:] for a in piece))  # type: ignore[arg-type]


def _checked(plan: WorkerPlan, pieces: Iterator[Piece]) -> Iterator[Piece]:
    for piece in pieces:
        problem = _validate_block(plan, *piece)
        if problem:
            raise ValueError(problem)
        yield piece


def _fill(pieces: Iterator[Piece], expected: int, plan: WorkerPlan) -> Piece:
    """The block's arrays allocated once for the `expected` rows and filled piece by piece (so loading
    holds one piece beyond the block); rows beyond `expected` (a caller's wrong count) are appended."""
    block = _empty(plan, expected)
    row, extra = 0, []
    for piece in pieces:
        rows = len(piece[0])
        take = min(rows, expected - row)
        for whole, part in zip(block, piece, strict=True):
            whole[row:row + take] = part[:take]
        row += take
        if take < rows:
            extra.append(tuple(a[take:] for a in piece))
    if extra:
        return tuple(np.concatenate([whole, *(e[n] for e in extra)]) for n, whole in enumerate(block))  # type: ignore[return-value]
    return block if row == expected else tuple(a[:row].copy() for a in block)  # type: ignore[return-value]


def reset_peak_rss() -> None:
    """Start this task's peak-RSS count afresh (a reused Python worker keeps its old peak otherwise)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory since `reset_peak_rss` (VmHWM), as the OS counts it."""
    return status_mb("VmHWM")


def _agree_and_connect(plan: WorkerPlan, ctx: Any, num_rows: int, problem: str) -> tuple[Collective, list[int]]:
    """One allGather agrees on the blocks (sizes, data errors) and shares rank 0's rendezvous port
    (each allGather costs about 1 s); then the collective backend starts. Returns it and the block sizes."""
    cfg = plan.config
    # Collectives time out well after the driver's stall watchdog, which names the stalled rank.
    timeout = max(cfg.gloo_timeout_seconds, int(cfg.timeouts.step_seconds) + 30)
    rendezvous = Rendezvous(cfg.backend, ctx, timeout_seconds=timeout)
    try:
        mine = {"rows": int(num_rows), "error": problem, "port": rendezvous.port}
        facts = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
        errors = [f"rank {r}: {f['error']}" for r, f in enumerate(facts) if f["error"]]
        if errors:
            raise ValueError("; ".join(errors))
        rows = [f["rows"] for f in facts]
        if sum(rows) != plan.total_rows:
            raise RuntimeError(f"blocks hold {sum(rows)} rows but the driver counted {plan.total_rows}")
        rendezvous.share([f["port"] for f in facts])
        coll = start_collective(cfg.backend, ctx, timeout_seconds=timeout, interface=cfg.network_interface,
                                horovod=cfg.horovod, rendezvous=rendezvous)
    finally:
        rendezvous.close()
    return coll, rows


def _results(trainer: Trainer, ctx: Any, facts: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """Rank 0's final weights in chunks, then every rank's summary row."""
    rank = trainer.rank
    summary = {
        "rank": rank,
        "host": os.uname().nodename,
        "task_address": ctx.getTaskInfos()[rank].address,
        "device": str(trainer.device),
        "rows": trainer.block.rows,
        "peak_rss_mb": peak_rss_mb(),
        "steps": trainer.step_count,
        "resumed_at": trainer.first_step,
        "read_seconds": trainer.read_seconds,
        "direct_reads": getattr(trainer.block, "direct_reads", None),
        "epochs_run": len(trainer.history),
        **facts,
        "bytes_sent": float(trainer.traffic[1]),
        "payload_bytes": float(trainer.traffic[0]),
        "num_params": trainer.num_params,
        "optimizer_bytes": optimizer_bytes(trainer.optimizer),
        "anon_at_model_mb": trainer.anon_at_model_mb,
        "step_timings": trainer.timings[trainer.first_step:trainer.step_count].round(7).tolist(),
        "history": trainer.history if rank == 0 else [],
        "digest": params_digest(trainer.model),
    }
    if rank == 0:
        yield _rows("model", rank, list(_state_chunks(trainer.model)))
    yield _rows("summary", rank, [json.dumps(summary).encode()])


def make_worker(plan: WorkerPlan):
    """The function handed to `mapInArrow(..., barrier=True)`; pickles `plan` only.

    Synchronization protocol, step by step (every rank runs the same sequence, so
    the collectives always match and unequal blocks cannot deadlock):

    1. Load: the task's Arrow batches (or, with blocks=files, its row range of the
       Parquet files: `shard_reader.iter_pieces`) are checked and stored as they arrive,
       no per-row Python: in memory, or on the executor's local disk
       (`block_store`, train.block_storage), kept for all epochs.
    2. Agree: `allGather` of (rows, errors, rank 0's rendezvous port). If any rank
       found a problem, every rank raises the same error, so none is left waiting.
       The step count per epoch was fixed by the driver from the global row count,
       and every rank now knows every block size, hence each step's global batch.
    3. Start the collective backend (`collectives.start_collective`).
    4. Rank 0's initial parameters are broadcast; every replica starts identical.
    5. `trainer.Trainer` runs the loop. Each step: the worker takes its slice of a seeded per-epoch permutation
       (slices proportional to block size), computes the *summed* loss and its
       gradients, divides them by the step's global batch size and exchanges the
       flat buffer (one collective per step, optionally compressed, see
       `compression`). The sum is the mean gradient of the global batch (the union
       of the local batches) on every rank; every replica then takes the identical
       optimizer step. Epoch loss and accuracy are summed once per epoch.
       In `sync: parameters` mode, the worker steps on its own mean gradient and
       every `sync_every` steps (and at the end) all-reduces
       [parameters x samples since the last sync, samples] and sets the
       sample-weighted average (local SGD / federated averaging).
    6. Every `check_every` steps and at the end: an all-gather of every rank's full
       SHA-1 of its parameter bytes; a rank whose digest differs from rank 0's
       raises `ReplicaDivergence` naming it. A NaN or infinite synchronized
       gradient (or epoch loss) stops every rank at the same step with
       `TrainingDiverged`.
    7. Checkpoints (with `checkpoint.dir`): every `every_steps` steps all ranks
       take part in `checkpoint.write` at the same step (each writes its own
       state; rank 0 the model, optimizer and manifest). A relaunch passes
       `resume_from`, and every rank restores it and skips the steps already done.
    8. Results: rank 0 emits the final state_dict (safetensors bytes) in 4 MiB
       chunks; every rank emits its timing summary. The collective is closed in
       `finally`.
    9. Failures: the task raises one line, `[blocksync rank R kind=K] Type: message`,
       where K is `input` (bad data or settings: a ValueError, never retried, exit 2)
       or `runtime`; the heartbeat carries the same kind to the driver's monitor.

    Throughout, a heartbeat thread tells the driver each rank's step and phase
    (`progress.Heartbeat`), which is how stalls and dead workers are named.

    The closure pickles only `WorkerPlan` (plain data): no SparkSession, no `self`.
    """

    def worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        try:
            yield from run_worker(plan, batches, ctx)
        except Exception as err:
            # The driver reads this line: the worker's own error, its rank and its kind.
            detail = traceback.format_exc(limit=-3)
            raise RuntimeError(
                f"[blocksync rank {ctx.partitionId()} kind={error_kind(err)}] {type(err).__name__}: {err}\n{detail}"
            ) from err

    return worker
