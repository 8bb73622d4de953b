"""The training loss: cross-entropy or MSE, or a user's function named `package.module:fn`.

Contract of a custom loss (`TrainConfig.loss`): `fn(outputs, labels)` takes the network's outputs
(float32 [rows, num_outputs]) and the labels (int64 class indices for classification, float32
targets for regression) of one rank's local batch, and returns ONE number: the loss SUMMED over
those rows, differentiable in `outputs`. Summed, because block sync adds every rank's sum and divides
by the global batch size: a mean per rank would weight small local batches like large ones, and the
result would no longer equal one process's loop. Class weights and multi-task heads fit this
contract; per-row weights from a column do not (use the built-in losses for those). Plain label
smoothing needs no custom loss: `TrainConfig.label_smoothing` applies it to the built-in
cross-entropy (and is refused together with a custom loss).

`check_loss` probes the function on the driver before launch with random outputs: it must return a
finite scalar that depends on the outputs, and the same rows twice must give twice the loss (a sum),
not the same loss (a mean).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

PROBE_ROWS = 6


def loss_sum(outputs: torch.Tensor, labels: torch.Tensor, task: str, weights: torch.Tensor | None = None,
             custom: LossFn | None = None, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed (not averaged) loss, each row's times its weight when given, so workers' sums add up to
    the global batch's. `custom`: a user's loss (see the module docstring), given the labels as the
    built-in loss reads them. `label_smoothing`: cross-entropy's (torch's meaning: the target puts
    1 - eps on the label and eps spread evenly over all classes); a per-row loss, so sums still add up."""
    if custom is not None:
        assert weights is None, "a custom loss with row weights is refused before launch"
        return custom(outputs, labels.long() if task == "classification" else labels.to(outputs.dtype))
    reduction = "sum" if weights is None else "none"
    if task == "classification":
        loss = nn.functional.cross_entropy(outputs, labels.long(), reduction=reduction, label_smoothing=label_smoothing)
    else:
        loss = nn.functional.mse_loss(outputs.squeeze(-1), labels.to(outputs.dtype), reduction=reduction)
    return loss if weights is None else (loss * weights.to(loss.dtype)).sum()


def import_loss(path: str) -> LossFn:
    """The function `package.module:fn` names, or a ValueError naming the `loss` setting."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"loss={path!r} is not an import path 'package.module:fn'; leave loss unset for "
                         "cross-entropy (classification) or MSE (regression).")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"loss={path!r}: cannot import {module_name!r} ({err}); it must be importable on the "
                         "driver and on every executor.") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"loss={path!r}: {module_name} has no callable {attr!r}.")
    return fn


def check_loss(path: str, task: str, num_outputs: int) -> None:
    """Probe the loss on the driver (see the module docstring); a ValueError says what is wrong."""
    fn = import_loss(path)
    generator = torch.Generator().manual_seed(0)
    outputs = torch.randn(PROBE_ROWS, num_outputs, generator=generator, requires_grad=True)
    if task == "classification":
        labels = torch.arange(PROBE_ROWS, dtype=torch.float64) % num_outputs
    else:
        labels = torch.randn(PROBE_ROWS, generator=generator, dtype=torch.float64)
    once = _call(fn, path, outputs, labels, task)
    twice = _call(fn, path, torch.cat([outputs, outputs]), torch.cat([labels, labels]), task)
    if not once.requires_grad:
        raise ValueError(f"loss={path!r} does not depend on the outputs (no gradient flows through it).")
    a, b = float(once.detach()), float(twice.detach())
    if abs(b - 2 * a) <= 1e-4 * max(1.0, abs(a)):
        return
    if abs(b - a) <= 1e-4 * max(1.0, abs(a)):
        raise ValueError(f"loss={path!r} returns the mean over the batch's rows ({a:.4g} for {PROBE_ROWS} rows and "
                         f"for the same rows twice); return their sum (e.g. reduction='sum'): block sync divides "
                         "the summed loss by the global batch size itself.")
    raise ValueError(f"loss={path!r} is not a sum over the batch's rows: {a:.4g} for {PROBE_ROWS} rows but "
                     f"{b:.4g} for the same rows twice (a sum gives twice as much).")


def _call(fn: LossFn, path: str, outputs: torch.Tensor, labels: torch.Tensor, task: str) -> torch.Tensor:
    rows = outputs.shape[0]
    try:
        value = loss_sum(outputs, labels, task, custom=fn)
    except Exception as err:  # the user's code: say what it was called with
        raise ValueError(f"loss={path!r} failed on outputs of shape {tuple(outputs.shape)} and {rows} labels "
                         f"({type(err).__name__}: {err}); it takes (outputs, labels).") from err
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"loss={path!r} returns {shape} for a batch of {rows} rows; it must return one number, "
                         "the loss summed over the rows.")
    if not torch.isfinite(value).all():
        raise ValueError(f"loss={path!r} returns {float(value)} on random outputs; it must be finite.")
    return value.reshape(())
