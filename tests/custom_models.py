"""A user model factory, named by import path in a test."""

from torch import nn


def tiny_net(num_features: int, num_outputs: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(num_features, width), nn.Tanh(), nn.Linear(width, num_outputs))


def wide_net(num_features: int, num_outputs: int) -> nn.Module:
    """Ignores num_outputs: 15 outputs whatever the task needs."""
    return nn.Linear(num_features, 15)


def narrow_net(num_features: int, num_outputs: int) -> nn.Module:
    """One output short of what the task needs."""
    return nn.Linear(num_features, max(1, num_outputs - 1))
