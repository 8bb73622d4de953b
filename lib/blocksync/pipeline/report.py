"""Run report files: history.jsonl, steps.parquet, timeline.json (Chrome trace), report.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from blocksync.engine.driver.metrics import PHASES
from blocksync.engine.worker.startup import describe as startup_caption


def steps_frame(rank_summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per rank per step: start offset and the four phase durations, in seconds."""
    frames = []
    for s in rank_summaries:
        t = np.asarray(s["step_timings"], dtype=np.float64).reshape(-1, 5)
        frame = pd.DataFrame(t, columns=["start", *PHASES])
        first = int(s.get("resumed_at", 0))  # a relaunched run's timings start after its checkpoint
        frame.insert(0, "step", np.arange(first + 1, first + len(t) + 1))
        frame.insert(0, "rank", s["rank"])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def timeline(steps: pd.DataFrame) -> dict[str, Any]:
    """Chrome trace events (open in Perfetto or chrome://tracing): one track per rank, a span per phase."""
    events: list[dict[str, Any]] = []
    for rank in sorted(steps["rank"].unique()):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": int(rank), "args": {"name": f"rank {rank}"}})
    for row in steps.itertuples(index=False):
        at = row.start
        for phase in PHASES:
            duration = float(getattr(row, phase))
            events.append({"name": phase, "cat": phase, "ph": "X", "pid": 0, "tid": int(row.rank),
                           "ts": at * 1e6, "dur": duration * 1e6, "args": {"step": int(row.step)}})
            at += duration
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def history_lines(history: list[dict[str, Any]]) -> str:
    """history.jsonl: one JSON object per epoch."""
    return "".join(json.dumps(h) + "\n" for h in history)


def rank_labels(ranks: list[int], metrics: dict[str, Any]) -> tuple[list[str], str]:
    """Tick labels under the per-rank bars: each rank's share of the rows and probed speed (balance=speed)
    and its peak RSS, where known; and what they show ("" when nothing is)."""
    labels, what = [str(r) for r in ranks], []
    balance = metrics.get("balance") or {}
    if balance.get("mode") == "speed" and len(balance.get("row_shares", [])) == len(ranks):
        blocks = balance.get("block_of_rank") or list(range(len(ranks)))  # the speed its block was cut for
        speeds = [balance["probe_rows_per_s"][b] for b in blocks]
        labels = [f"{lab}\n{100 * s:.0f}% rows\n{v:,.0f} rows/s" for lab, s, v in
                  zip(labels, balance["row_shares"], speeds, strict=True)]
        what.append("its share of the rows and probed speed (balance=speed"
                    + (": speeds within tolerance, cut even)" if balance.get("cut") == "even" else ")"))
    peaks = metrics.get("peak_rss_mb") or []
    if len(peaks) == len(ranks) and all(p is not None for p in peaks):  # the OS's peak resident memory per rank
        labels = [f"{lab}\n{p:,.0f} MiB" for lab, p in zip(labels, peaks, strict=True)]
        what.append(f"peak RSS (block_storage={metrics.get('block_storage', 'memory')})")
    return labels, " and ".join(what)


def plot_report(path: Path, history: list[dict[str, Any]], steps: pd.DataFrame, metrics: dict[str, Any]) -> None:
    """Loss per epoch, and per-rank compute against sync time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    epochs = [h["epoch"] for h in history]
    ax_loss.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train loss")
    if "test_loss" in metrics:
        ax_loss.axhline(metrics["test_loss"], color="tab:red", linestyle="--", label="test loss (final)")
    title = "loss"
    if "test_accuracy" in metrics:
        title += f" (test accuracy {metrics['test_accuracy']:.3f})"
    elif "test_r2" in metrics:
        title += f" (test R2 {metrics['test_r2']:.3f})"
    ax_loss.set(title=title, xlabel="epoch", ylabel="loss")
    ax_loss.legend()

    per_rank = steps.groupby("rank")[list(PHASES)].sum()
    bottom = np.zeros(len(per_rank))
    for phase in PHASES:
        ax_time.bar(per_rank.index.to_numpy(), per_rank[phase], bottom=bottom, label=phase)
        bottom += per_rank[phase].to_numpy()
    ax_time.set(title=f"time per rank (sync fraction {metrics.get('sync_fraction', 0):.2f})",
                xlabel="rank", ylabel="seconds")
    labels, what = rank_labels(list(per_rank.index), metrics)
    if what:
        ax_time.set_xticks(per_rank.index.to_numpy(), labels)
        ax_time.set_xlabel("rank, " + what)
    ax_time.legend()
    fig.tight_layout()
    caption = startup_caption(metrics.get("startup_phases") or {})
    if caption:
        fig.subplots_adjust(bottom=0.2)
        fig.text(0.01, 0.01, caption, fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
