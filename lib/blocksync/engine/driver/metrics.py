"""Run metrics from every rank's per-step timings: throughput, sync share, bytes, stragglers."""

from __future__ import annotations

import logging
import statistics
from typing import TYPE_CHECKING, Any

import numpy as np

from blocksync.engine.balance import SPEED_TOLERANCE
from blocksync.engine.config import TrainConfig
from blocksync.engine.driver.balancing import placement

if TYPE_CHECKING:
    from blocksync.engine.plan import WorkerPlan

log = logging.getLogger(__name__)

PHASES = ("data", "compute", "sync", "optimizer")
"""The timed phases of one step, in order; a rank's step_timings rows are (start, *PHASES) seconds."""


def slowest_startup(summaries: list[dict[str, Any]]) -> dict[str, float]:
    """The start-up phases (`startup`) of the rank that reached its first step last, with its rank."""
    ranked = [s for s in summaries if s.get("startup_phases")]
    if not ranked:
        return {}
    last = max(ranked, key=lambda s: s["startup_phases"]["launch_to_first_step_s"])
    return {"rank": last["rank"], **last["startup_phases"]}


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
    """Throughput, the share of step time spent in the collective, bytes, stragglers, from every rank's timings.

    Bytes count the whole run, restarts included (they travel in checkpoints); samples_per_sec and the
    timings are those of the final attempt, over the steps it trained (from `resumed_at_step`).
    """
    # step_timings rows: start, data, compute, sync, optimizer (seconds)
    step_time = [sum(sum(t[1:]) for t in s["step_timings"]) for s in summaries]
    sync_time = [sum(t[3] for t in s["step_timings"]) for s in summaries]
    train_seconds = max(s["train_seconds"] for s in summaries)
    # After a relaunch, the timings and seconds cover the final attempt: the steps from its checkpoint on.
    resumed_at = summaries[0]["resumed_at"]
    steps = summaries[0]["steps"]  # plan.total_steps, or fewer after an early stop
    samples = plan.total_rows * (steps - resumed_at) / plan.steps_per_epoch
    timing = timing_summary(summaries)
    stragglers = find_stragglers(timing, config.straggler_factor, config.straggler_min_ms)
    if stragglers:
        log.warning("straggler rank(s) %s: median compute above %.1fx the ranks' median", stragglers,
                    config.straggler_factor)
    return {
        "epochs": len(summaries[0]["history"]),
        "steps": steps,
        "num_workers": config.num_workers,
        "backend": config.backend,
        "sync": config.sync,
        "compression": config.compression,
        "shard": config.shard,
        "overlap": config.overlaps,
        "train_loss": summaries[0]["history"][-1]["train_loss"],
        "samples_per_sec": samples / train_seconds if train_seconds > 0 else float("nan"),
        "train_seconds": train_seconds,
        "resumed_at_step": resumed_at,
        "stage_seconds": wall,
        "startup_seconds": max(s["startup_seconds"] for s in summaries),
        "startup_phases": slowest_startup(summaries),
        "sync_fraction": sum(sync_time) / sum(step_time) if sum(step_time) > 0 else 0.0,
        "blocks": "files" if plan.shards else "shuffle",  # what ran, also when config.blocks is auto
        "block_storage": summaries[0].get("block_storage", "memory"),
        "epoch_order": "chunks" if plan.chunks is not None else "global",  # what ran, also with epoch_order=auto
        "peak_rss_mb": [s.get("peak_rss_mb") for s in sorted(summaries, key=lambda s: s["rank"])],
        "peak_anon_mb": [s.get("peak_anon_mb") for s in sorted(summaries, key=lambda s: s["rank"])],
        # RssAnon once the model and an empty optimizer were built, before gradients, optimizer state and buffers.
        "anon_at_model_mb": [s.get("anon_at_model_mb") for s in sorted(summaries, key=lambda s: s["rank"])],
        # The optimizer's state tensors on each rank (Adam: 2 x 4 bytes a parameter; 1/N of that sharded).
        "optimizer_bytes_per_rank": [s.get("optimizer_bytes") for s in sorted(summaries, key=lambda s: s["rank"])],
        # epoch_order=chunks from disk or stream: each rank's window reading, overlapped with its steps
        "read_seconds": [s.get("read_seconds", 0.0) for s in sorted(summaries, key=lambda s: s["rank"])],
        # block_storage=disk in the chunk order: whether each rank read around the page cache (O_DIRECT; None:
        # no window reads), see engine.worker.direct_io
        "direct_reads": [s.get("direct_reads") for s in sorted(summaries, key=lambda s: s["rank"])],
        "bytes_sent": sum(s["bytes_sent"] for s in summaries),
        "payload_bytes_per_step": summaries[0]["payload_bytes"] / max(steps, 1),
        "median_step_ms": 1000 * statistics.median(sum(t[1:]) for t in summaries[0]["step_timings"]),
        "timing": timing,
        "stragglers": stragglers,
        "balance": balance_summary(config, plan, summaries),
    }


def balance_summary(config: TrainConfig, plan: WorkerPlan, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank: its share of the rows, its compute speed in training (rows per compute second) and its
    idle time in sync (seconds in the collective, mostly waiting for slower ranks); with balance=speed also
    the probe's speeds (rows/s at the even local batch), fixed step costs, hosts and executors (per block),
    the cut (`speed`, or `even` when the speeds were within tolerance), the block each rank read and the
    ranks that trained on another executor than their block was cut for (`misplaced_ranks`, with a warning).
    The same keys under `even` and `speed` compare runs."""
    ordered = sorted(summaries, key=lambda s: s["rank"])
    blocks = [s.get("block", s["rank"]) for s in ordered]
    rows = [plan.block_rows[b] for b in blocks] if plan.block_rows else [s["rows"] for s in ordered]
    epochs_run = max(summaries[0]["steps"] - summaries[0]["resumed_at"], 0) / plan.steps_per_epoch
    compute = [sum(t[2] for t in s["step_timings"]) for s in ordered]
    out: dict[str, Any] = {
        "mode": config.balance,
        "row_shares": [n / max(sum(rows), 1) for n in rows],
        "train_rows_per_s": [n * epochs_run / c if c > 0 else None for n, c in zip(rows, compute, strict=True)],
        "sync_idle_seconds": [sum(t[3] for t in s["step_timings"]) for s in ordered],
    }
    if plan.balance:
        b = plan.balance
        executors = [s.get("task_address", "") for s in ordered]
        misplaced = placement(b, blocks, executors)
        out.update(probe_rows_per_s=b["speeds"], probe_fixed_seconds=b.get("fixed_seconds") or [],
                   probe_hosts=b["hosts"], probe_executors=b.get("executors", []),
                   probe_seconds=b["probe_seconds"], probes=b.get("probes", 1), cut_rule=b.get("rule", ""),
                   probe_start_seconds=b.get("probe_start_seconds", 0.0),
                   speeds_from=b["source"], cut=b.get("cut", "speed"),
                   cut_reason=(f"speeds within tolerance ({100 * SPEED_TOLERANCE:.0f}%), cut even"
                               if b.get("cut") == "even" else "cut by speed"),
                   block_of_rank=blocks, train_executors=executors, misplaced_ranks=misplaced)
        if misplaced:
            why = ("the executors changed since the probe (a relaunch on new executors?)" if plan.shards else
                   "Spark placed the stages' tasks differently and a partition's rows cannot follow its executor "
                   "with blocks=shuffle; use blocks=files (train_files), whose ranks read the block cut for "
                   "their executor")
            log.warning("balance=speed: rank(s) %s trained on other executors than their blocks were cut for "
                        "(cut for %s, ran on %s), so the cut does not fit the machines: %s.", misplaced,
                        [b["executors"][k] for k in blocks], executors, why)
    return out
