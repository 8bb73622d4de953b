"""User losses named by import path in tests (`loss: tests.custom_losses:NAME`). Each returns the loss
SUMMED over the rows it is given, as blocksync's contract asks, except the deliberately wrong ones."""

import torch
from torch import nn


def smoothed_cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with label smoothing 0.1 and more weight on class 2: two things plain CE lacks."""
    weight = torch.ones(outputs.shape[1])
    weight[2 % outputs.shape[1]] = 3.0
    return nn.functional.cross_entropy(outputs, labels, weight=weight, label_smoothing=0.1, reduction="sum")


def huber(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.huber_loss(outputs[:, 0], labels, delta=0.5, reduction="sum")


def mean_cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Wrong: the mean, not the sum."""
    return nn.functional.cross_entropy(outputs, labels)


def per_row_cross_entropy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Wrong: one loss per row, not one number."""
    return nn.functional.cross_entropy(outputs, labels, reduction="none")


def constant(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Wrong: does not depend on the outputs."""
    return torch.tensor(float(labels.shape[0]))
