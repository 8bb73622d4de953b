"""Optimizer and learning-rate schedule, built identically on every replica."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from blocksync.engine.config import TrainConfig


def build_optimizer(model: nn.Module | Sequence[torch.Tensor], cfg: TrainConfig) -> torch.optim.Optimizer:
    """`cfg`'s optimizer over the model's parameters, or over given tensors (a sharded run's pieces of its flat slice:
    Adam, AdamW and SGD with momentum are elementwise, so a slice steps exactly as those entries of the whole)."""
    params = list(model.parameters()) if isinstance(model, nn.Module) else list(model)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Multiplier of `cfg.lr` at 0-based `step`: linear warm-up, then the schedule."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 0.1 ** int(progress * 3)  # "step": x0.1 at 1/3 and 2/3 of training


def build_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: TrainConfig
) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
