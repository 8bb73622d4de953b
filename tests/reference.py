"""A plain single-process PyTorch loop that steps on the same global batches as the workers.

It rebuilds each worker's block (in the order the worker sees it) and, per
step, the union of the four local batches from the library's own seeded batch
plan; then it takes one ordinary optimizer step on the mean loss of that union.
"""

from __future__ import annotations

import numpy as np
import torch
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from blocksync.engine.block_data import batch_slices, epoch_permutation, steps_per_epoch
from blocksync.engine.config import TrainConfig
from blocksync.engine.models import build_model
from blocksync.engine.optim import build_optimizer, build_schedule, loss_sum


def collect_blocks(blocks: DataFrame, num_workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rows = blocks.withColumn("_pid", F.spark_partition_id()).collect()  # partition order kept
    out = []
    for rank in range(num_workers):
        mine = [r for r in rows if r["_pid"] == rank]
        x = np.array([r["features"] for r in mine], dtype=np.float32)
        y = np.array([r["label"] for r in mine], dtype=np.float64)
        out.append((x, y))
    return out


def reference_train(blocks: list[tuple[np.ndarray, np.ndarray]], cfg: TrainConfig, num_outputs: int) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)
    num_features = blocks[0][0].shape[1]
    model = build_model(cfg.model, num_features, num_outputs)
    optimizer = build_optimizer(model, cfg)
    total_rows = sum(len(y) for _, y in blocks)
    per_epoch = steps_per_epoch(total_rows, cfg.batch_size)
    schedule = build_schedule(optimizer, per_epoch * cfg.epochs, cfg)
    for epoch in range(cfg.epochs):
        plans = []
        for rank, (_, y) in enumerate(blocks):
            order = epoch_permutation(len(y), cfg.seed, rank, epoch)
            plans.append((order, batch_slices(len(y), per_epoch)))
        for step in range(per_epoch):
            xs, ys = [], []
            for (x, y), (order, slices) in zip(blocks, plans, strict=True):
                lo, hi = slices[step]
                xs.append(x[order[lo:hi]])
                ys.append(y[order[lo:hi]])
            xb, yb = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
            optimizer.zero_grad()
            (loss_sum(model(xb), yb, cfg.task) / len(yb)).backward()
            optimizer.step()
            schedule.step()
    return model


def max_param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))
