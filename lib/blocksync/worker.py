"""Worker side: the function each barrier task runs (one per block, one rank each).

Synchronization protocol, step by step (every rank runs the same sequence, so
the collectives always match and unequal blocks cannot deadlock):

1. Load: the task's Arrow batches (or, with blocks=files, its row range of the
   Parquet files: `shards.read_block`) become one float32 tensor block, kept for
   all epochs (`block_data.arrow_to_block`, no per-row Python).
2. Agree: `allGather` of (rows, errors, rank 0's rendezvous port). If any rank
   found a problem, every rank raises the same error, so none is left waiting.
   The step count per epoch was fixed by the driver from the global row count,
   and every rank now knows every block size, hence each step's global batch.
3. Start the collective backend (`collectives.start_collective`).
4. Rank 0's initial parameters are broadcast; every replica starts identical.
5. Each step: the worker takes its slice of a seeded per-epoch permutation
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
6. Every `check_every` steps and at the end: `allGather` of a SHA-1 of the
   parameter bytes; a rank whose digest differs from rank 0's raises
   `ReplicaDivergence` naming it.
7. Checkpoints (with `checkpoint.dir`): every `every_steps` steps all ranks
   take part in `checkpoint.write` at the same step (each writes its own
   state; rank 0 the model, optimizer and manifest). A relaunch passes
   `resume_from`, and every rank restores it and skips the steps already done.
8. Results: rank 0 emits the final state_dict (safetensors bytes) in 4 MiB
   chunks; every rank emits its timing summary. The collective is closed in
   `finally`.

Throughout, a heartbeat thread tells the driver each rank's step and phase
(`progress.Heartbeat`), which is how stalls and dead workers are named.

The closure pickles only `WorkerPlan` (plain data): no SparkSession, no `self`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from blocksync import checkpoint
from blocksync.block_data import arrow_to_block, batch_slices, epoch_permutation
from blocksync.collectives import Collective, Rendezvous, start_collective, to_collective
from blocksync.compression import make_compressor
from blocksync.config import TrainConfig
from blocksync.models import build_model
from blocksync.optim import build_optimizer, build_schedule, loss_sum
from blocksync.progress import Heartbeat
from blocksync.shards import ShardPlan, read_block

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
RESULT_SCHEMA = pa.schema(
    [("kind", pa.string()), ("rank", pa.int32()), ("seq", pa.int32()), ("payload", pa.binary())]
)
RESULT_SCHEMA_DDL = "kind string, rank int, seq int, payload binary"


class ReplicaDivergence(RuntimeError):
    """Replicas no longer hold identical parameters after a sync."""


@dataclass(frozen=True)
class WorkerPlan:
    """Everything a worker needs, resolved by the driver into plain values."""

    config: TrainConfig
    num_features: int
    num_outputs: int
    total_rows: int
    steps_per_epoch: int
    monitor_address: str | None = None
    """host:port of the driver's RunMonitor (heartbeats from every rank, progress from rank 0), or None."""
    attempt: int = 0
    """0 for the first launch, then 1, 2, ... for relaunches after a failure."""
    resume_from: str | None = None
    """Checkpoint folder to resume from (validated by the driver), or None to start fresh."""
    shards: ShardPlan | None = None
    """blocks=files: each rank reads its rows of the Parquet files itself (`shards`); None: the
    task's input partition is its block."""

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.config.epochs


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


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_replicas(coll: Collective, model: torch.nn.Module, step: int) -> None:
    digests = coll.gather_digests(params_digest(model))
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    if bad:
        raise ReplicaDivergence(
            f"replica(s) {bad} diverged from rank 0 after step {step} (parameter digests differ)"
        )


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _set_params(model: torch.nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat.to(next(model.parameters()).device), model.parameters())


def _state_chunks(model: torch.nn.Module) -> Iterator[bytes]:
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    blob = save(state)
    for start in range(0, len(blob), CHUNK_BYTES):
        yield blob[start : start + CHUNK_BYTES]


def _rows(kind: str, rank: int, payloads: list[bytes]) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_arrays(
        [pa.array([kind] * n), pa.array([rank] * n, pa.int32()), pa.array(range(n), pa.int32()),
         pa.array(payloads, pa.binary())],
        schema=RESULT_SCHEMA,
    )


def _validate_block(plan: WorkerPlan, x: np.ndarray, y: np.ndarray) -> str:
    if x.shape[0] and x.shape[1] != plan.num_features:
        return f"block has {x.shape[1]} features, expected {plan.num_features}"
    if not np.isfinite(x).all():
        return f"{int((~np.isfinite(x)).any(axis=1).sum())} rows have NaN or infinite features"
    if plan.config.task == "classification" and y.size:
        bad = (y < 0) | (y >= plan.num_outputs) | (y != np.floor(y))
        if bad.any():
            return f"{int(bad.sum())} labels are not class indices in [0, {plan.num_outputs})"
    return ""


def run_worker(plan: WorkerPlan, batches: Iterator[pa.RecordBatch], ctx: Any) -> Iterator[pa.RecordBatch]:
    cfg = plan.config
    rank = ctx.partitionId()
    beat = Heartbeat(plan.monitor_address, rank)
    finished, error = False, None
    try:
        threads = cfg.threads_per_worker or max(1, int(ctx.cpus()) if hasattr(ctx, "cpus") else 1)
        torch.set_num_threads(threads)
        gpus = list(ctx.resources()["gpu"].addresses) if "gpu" in ctx.resources() else []
        device, warning = select_device(cfg.device, gpus)
        if warning:
            log.warning("rank %d: %s", rank, warning)

        t0 = time.perf_counter()
        try:
            if plan.shards:
                for _ in batches:  # the rank's placeholder row; Spark reuses a Python worker only after its input ends
                    pass
                x_np, y_np = read_block(plan.shards, rank, plan.num_features)
            else:
                x_np, y_np = arrow_to_block(batches)
            problem = _validate_block(plan, x_np, y_np)
        except ValueError as err:  # bad data in this block: every rank fails with it, none waits
            x_np, y_np, problem = np.zeros((0, plan.num_features), np.float32), np.zeros(0), str(err)
        load_seconds = time.perf_counter() - t0

        beat.at(0, "startup")
        t0 = time.perf_counter()
        # Collectives time out well after the driver's stall watchdog, which names the stalled rank.
        timeout = max(cfg.gloo_timeout_seconds, int(cfg.timeouts.step_seconds) + 30)
        rendezvous = Rendezvous(cfg.backend, ctx, timeout_seconds=timeout)
        try:
            # One allGather agrees on the blocks and shares rank 0's rendezvous port (each costs ~1 s).
            mine = {"rows": int(x_np.shape[0]), "error": problem, "port": rendezvous.port}
            facts = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
            errors = [f"rank {r}: {f['error']}" for r, f in enumerate(facts) if f["error"]]
            if errors:
                raise ValueError("; ".join(errors))
            rows = [f["rows"] for f in facts]
            if sum(rows) != plan.total_rows:
                raise RuntimeError(f"blocks hold {sum(rows)} rows but the driver counted {plan.total_rows}")
            rendezvous.share([f["port"] for f in facts])
            x = torch.from_numpy(x_np).to(device)  # x_np is a fresh array we own
            y = torch.from_numpy(y_np).to(device)
            coll = start_collective(cfg.backend, ctx, timeout_seconds=timeout, interface=cfg.network_interface,
                                    horovod=cfg.horovod, rendezvous=rendezvous)
        finally:
            rendezvous.close()
        startup_seconds = time.perf_counter() - t0
        try:
            yield from _train(plan, coll, ctx, x, y, rows, device, beat,
                              {"load_seconds": load_seconds, "startup_seconds": startup_seconds, "threads": threads,
                               "gpu_addresses": gpus, "device_warning": warning})
            finished = True
        finally:
            coll.close()
    except BaseException as err:
        error = f"{type(err).__name__}: {err}"
        raise
    finally:
        beat.close(done=finished, error=error)


def _inject_fault(cfg: TrainConfig, attempt: int, rank: int, step: int, beat: Heartbeat) -> None:
    faults = cfg.faults
    if faults.kill_rank != rank or faults.at_step != step or attempt >= faults.repeat:
        return
    log.warning("rank %d: injecting fault %r at step %d (attempt %d)", rank, faults.mode, step, attempt)
    beat.at(step, "compute")
    beat.flush()
    if faults.mode == "exit":
        os._exit(17)  # the Python worker dies like a killed process: no cleanup, no exception
    if faults.mode == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    if faults.mode == "executor":
        os.kill(_executor_jvm_pid(), signal.SIGKILL)  # the executor and every task on it are lost
    # hang: the heartbeat thread keeps reporting this step until the stage is cancelled;
    # executor: this worker waits to be torn down with its dead JVM.
    while True:
        time.sleep(3600)


def _executor_jvm_pid() -> int:
    """The JVM this Python worker serves: the nearest `java` ancestor (Linux /proc)."""
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/comm") as fh:
            if fh.read().strip() == "java":
                return pid
        with open(f"/proc/{pid}/stat") as fh:  # "pid (comm) state ppid ...": comm may hold spaces
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("faults.mode=executor: no executor JVM among this Python worker's ancestors")


def _train(
    plan: WorkerPlan, coll: Collective, ctx: Any, x: torch.Tensor, y: torch.Tensor, block_rows: list[int],
    device: torch.device, beat: Heartbeat, facts: dict[str, Any],
) -> Iterator[pa.RecordBatch]:
    cfg = plan.config
    rank, n_local = coll.rank, int(x.shape[0])
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, plan.num_features, plan.num_outputs).to(device)
    _set_params(model, coll.broadcast(to_collective(coll, _flat_params(model).contiguous()), root=0))
    model.train()
    optimizer = build_optimizer(model, cfg)
    schedule = build_schedule(optimizer, plan.total_steps, cfg)
    params = list(model.parameters())
    num_params = sum(p.numel() for p in params)
    # Gradients exist from the start, so an empty local batch still all-reduces zeros;
    # zero_grad(set_to_none=False) and backward() keep writing into these same tensors.
    grads = [torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g

    # Every rank knows every block size, so the global batch size of each step is known up front:
    # contributions are divided by it before the exchange and the exchange returns the mean gradient.
    global_batch = np.sum([[hi - lo for lo, hi in batch_slices(n, plan.steps_per_epoch)] for n in block_rows], axis=0)
    compressor = make_compressor(cfg.compression, coll, num_params, topk_ratio=cfg.topk_ratio, seed=cfg.seed)
    slow_seconds = cfg.faults.slow_ms / 1000.0 if cfg.faults.slow_rank == rank else 0.0
    classification = cfg.task == "classification"
    history: list[dict[str, float]] = []
    step = 0
    local_stats = torch.zeros(3, dtype=torch.float64)  # samples, summed loss, correct predictions (this epoch)
    if plan.resume_from:
        snap = checkpoint.read(plan.resume_from, rank)
        model.load_state_dict(snap.model)
        optimizer.load_state_dict(snap.optimizer)
        schedule.load_state_dict(snap.scheduler)
        torch.set_rng_state(snap.rng)
        compressor.load_state({k: v for k, v in snap.rank_state.items() if k != "epoch_stats"})
        local_stats = snap.rank_state["epoch_stats"].clone()
        history, step = snap.history, snap.step
        log.info("rank %d: resumed from %s at step %d", rank, plan.resume_from, step)

    def save_checkpoint(stats: torch.Tensor) -> None:
        if not cfg.checkpoint.dir or step % cfg.checkpoint.every_steps or step == plan.total_steps:
            return
        beat.at(step, "checkpoint")
        checkpoint.write(
            cfg.checkpoint.dir, rank=rank, step=step, keep=cfg.checkpoint.keep,
            barrier=lambda: coll.allreduce_sum(torch.zeros(1)), model=model, optimizer=optimizer,
            scheduler=schedule, history=history, rank_state={**compressor.state(), "epoch_stats": stats},
        )

    # Per step: start (s since training began), data, compute, sync, optimizer seconds.
    timings = np.zeros((plan.total_steps, 5), dtype=np.float64)
    payload_bytes = wire_bytes = 0.0
    samples_since_sync = 0.0
    first_step = step
    train_start = time.perf_counter()
    for epoch in range(step // plan.steps_per_epoch, cfg.epochs):
        order = torch.from_numpy(epoch_permutation(n_local, cfg.seed, rank, epoch)).to(device)
        slices = batch_slices(n_local, plan.steps_per_epoch)
        for s_in_epoch in range(step - epoch * plan.steps_per_epoch, plan.steps_per_epoch):
            lo, hi = slices[s_in_epoch]
            beat.at(step, "compute")
            _inject_fault(cfg, plan.attempt, rank, step, beat)
            t_data = time.perf_counter()
            idx = order[lo:hi]
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            t_compute = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            count = float(hi - lo)
            if count:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.mixed_precision == "bf16"):
                    out = model(xb)
                    loss = loss_sum(out.float(), yb, cfg.task)
                loss.backward()
                local_stats[0] += count
                local_stats[1] += float(loss.detach())
                if classification:
                    local_stats[2] += float((out.detach().argmax(1) == yb.long()).sum())
            if slow_seconds:
                time.sleep(slow_seconds)
            t_sync = time.perf_counter()
            beat.at(step, "sync")
            if cfg.sync == "gradients":
                contribution = torch.cat([g.reshape(-1) for g in grads]) / float(global_batch[s_in_epoch])
                exchanged = compressor.exchange(to_collective(coll, contribution), step)
                payload_bytes += exchanged.payload_bytes
                wire_bytes += exchanged.wire_bytes
                torch.nn.utils.vector_to_parameters(exchanged.mean_gradient.to(device), grads)
            else:
                if count:
                    for g in grads:
                        g.div_(count)
                samples_since_sync += count
            t_opt = time.perf_counter()
            if cfg.sync == "gradients" or count:
                optimizer.step()
            schedule.step()
            step += 1
            t_end = time.perf_counter()
            averaging = 0.0
            if cfg.sync == "parameters" and (step % cfg.sync_every == 0 or step == plan.total_steps):
                sent = _average_parameters(coll, model, samples_since_sync)
                payload_bytes += sent
                wire_bytes += coll.bytes_per_allreduce(int(sent))
                samples_since_sync = 0.0
                averaging = time.perf_counter() - t_end
            timings[step - 1] = (t_data - train_start, t_compute - t_data, t_sync - t_compute,
                                 t_opt - t_sync + averaging, t_end - t_opt)
            if cfg.check_every and step % cfg.check_every == 0:
                check_replicas(coll, model, step)
            if rank == 0:
                beat.progress(epoch=epoch + 1, step=step, loss=float(local_stats[1]) / max(float(local_stats[0]), 1.0),
                              samples_per_sec=_rate(plan, step - first_step, train_start))
            if s_in_epoch < plan.steps_per_epoch - 1:
                save_checkpoint(local_stats)
        # One tiny all-reduce per epoch makes the epoch's loss and accuracy global.
        beat.at(step, "sync")
        samples, loss_total, correct = coll.allreduce_sum(local_stats.float()).double().tolist()
        local_stats = torch.zeros(3, dtype=torch.float64)
        entry = {"epoch": epoch + 1, "step": step, "train_loss": loss_total / samples}
        if classification:
            entry["train_accuracy"] = correct / samples
        history.append(entry)
        if rank == 0:
            beat.progress(epoch=epoch + 1, step=step, loss=entry["train_loss"],
                          samples_per_sec=_rate(plan, step - first_step, train_start), epoch_end=True)
        save_checkpoint(local_stats)
    train_seconds = time.perf_counter() - train_start
    beat.at(step, "sync")
    check_replicas(coll, model, step)

    summary = {
        "rank": rank,
        "host": os.uname().nodename,
        "task_address": ctx.getTaskInfos()[rank].address,
        "device": str(device),
        "rows": n_local,
        "steps": step,
        "resumed_at": first_step,
        **facts,
        "train_seconds": train_seconds,
        "bytes_sent": wire_bytes,
        "payload_bytes": payload_bytes,
        "num_params": num_params,
        "step_timings": timings[first_step:].round(7).tolist(),
        "history": history if rank == 0 else [],
        "digest": params_digest(model),
    }
    if rank == 0:
        yield _rows("model", rank, list(_state_chunks(model)))
    yield _rows("summary", rank, [json.dumps(summary).encode()])


def _rate(plan: WorkerPlan, step: int, since: float) -> float:
    """Global samples per second so far."""
    return plan.total_rows * step / plan.steps_per_epoch / max(time.perf_counter() - since, 1e-9)


def _average_parameters(coll: Collective, model: torch.nn.Module, weight: float) -> int:
    """Set every replica to the sample-weighted mean of the replicas' parameters; returns bytes contributed."""
    params = to_collective(coll, _flat_params(model))
    flat = torch.cat([params * weight, torch.tensor([weight], device=params.device)])
    flat = coll.allreduce_sum(flat)
    _set_params(model, flat[:-1] / float(flat[-1]))
    return flat.numel() * 4


def make_worker(plan: WorkerPlan):
    """The function handed to `mapInArrow(..., barrier=True)`; pickles `plan` only."""

    def worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        try:
            yield from run_worker(plan, batches, ctx)
        except Exception as err:
            # The driver extracts this line, so the user sees the worker's own error and rank.
            detail = traceback.format_exc(limit=-3)
            raise RuntimeError(
                f"[blocksync rank {ctx.partitionId()}] {type(err).__name__}: {err}\n{detail}"
            ) from err

    return worker
