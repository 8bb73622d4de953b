"""Model registry: built identically from a `ModelSpec` on the driver and every worker."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
from torch import nn

from blocksync.engine.config import ModelSpec


def logreg(num_features: int, num_outputs: int) -> nn.Module:
    """Multinomial logistic regression (or linear regression with one output)."""
    return nn.Linear(num_features, num_outputs)


def mlp(num_features: int, num_outputs: int, hidden: list[int], dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = []
    width = num_features
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = int(h)
    layers.append(nn.Linear(width, num_outputs))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head, for image-shaped features (e.g. 8x8 digits)."""

    def __init__(self, num_features: int, num_outputs: int, image_shape: list[int] | None) -> None:
        super().__init__()
        if image_shape is None:
            side = math.isqrt(num_features)
            if side * side != num_features:
                raise ValueError(
                    f"model 'cnn' needs image-shaped features: {num_features} is not a square; "
                    "set model.image_shape to [channels, height, width]."
                )
            image_shape = [1, side, side]
        channels, height, width = (int(v) for v in image_shape)
        if channels * height * width != num_features:
            raise ValueError(
                f"model.image_shape={image_shape} holds {channels * height * width} values "
                f"but the data has {num_features} features."
            )
        self.shape = (channels, height, width)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(32 * 16, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], *self.shape)
        return self.head(self.features(x).flatten(1))


REGISTRY = ("logreg", "mlp", "cnn")


def _import_factory(path: str) -> Callable[..., nn.Module]:
    module_name, _, attr = path.partition(":")
    if not attr:
        raise ValueError(
            f"model.name={path!r} is neither a registered model ({', '.join(REGISTRY)}) "
            "nor an import path 'package.module:factory'."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"model.name={path!r}: cannot import {module_name!r} ({err}).") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"model.name={path!r}: {module_name} has no callable {attr!r}.")
    return factory


def build_model(spec: ModelSpec, num_features: int, num_outputs: int) -> nn.Module:
    """The network `spec` names, with default (unseeded) initialization."""
    if spec.name == "logreg":
        return logreg(num_features, num_outputs)
    if spec.name == "mlp":
        return mlp(num_features, num_outputs, spec.hidden, spec.dropout)
    if spec.name == "cnn":
        return SmallCNN(num_features, num_outputs, spec.image_shape)
    factory = _import_factory(spec.name)
    try:
        model = factory(num_features, num_outputs, **spec.options)
    except Exception as err:  # the user's code: say what we called it with
        raise ValueError(
            f"model.name={spec.name!r}: calling it as factory({num_features}, {num_outputs}, **model.options) "
            f"failed ({type(err).__name__}: {err}); a factory takes (num_features, num_outputs, **options) "
            "and returns a torch.nn.Module."
        ) from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.name={spec.name!r} returned {type(model).__name__}, not a torch.nn.Module.")
    return model


def is_custom(spec: ModelSpec) -> bool:
    """True when `spec` names an import path: building it imports and runs that code."""
    return spec.name not in REGISTRY


def check_importable(spec: ModelSpec) -> None:
    """A custom `package.module:factory` must import and be callable (checked before any slow stage)."""
    if is_custom(spec):
        _import_factory(spec.name)


def validate_spec(spec: ModelSpec, num_features: int, num_outputs: int) -> None:
    """Build once on the driver and run a probe forward pass on two zero rows, so a bad spec, or a
    network whose output width is not `num_outputs`, fails before any barrier task starts."""
    model = build_model(spec, num_features, num_outputs)
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, num_features))
    except Exception as err:
        raise ValueError(
            f"model.name={spec.name!r}: a forward pass on a batch of shape (2, {num_features}) failed "
            f"({type(err).__name__}: {err}); the network must take [batch, {num_features}] float features."
        ) from err
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_outputs):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"model.name={spec.name!r} returns outputs of shape {shape} for a batch of 2, but this task needs "
            f"(2, {num_outputs}) ({num_outputs} = classes, or 1 for regression); make its last layer "
            f"{num_outputs} wide (the factory receives num_outputs={num_outputs})."
        )


def state_bytes(model: nn.Module) -> bytes:
    """The model's weights as safetensors bytes (CPU, contiguous): how weights travel and are stored."""
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})


def module_from_bytes(spec: ModelSpec, num_features: int, num_outputs: int, weights: bytes) -> nn.Module:
    """The network `spec` names with `weights` (safetensors bytes, see `state_bytes`) loaded, in eval mode."""
    from safetensors.torch import load

    module = build_model(spec, num_features, num_outputs)
    module.load_state_dict(load(weights))
    return module.eval()
