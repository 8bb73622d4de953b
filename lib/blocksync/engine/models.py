"""Model registry: built identically from a `ModelSpec` on the driver and every worker.

One feature matrix: `logreg`, `mlp`, `cnn`, or `package.module:factory` called as
factory(num_features, num_outputs, **options); the network takes float32 [batch, num_features].
Typed inputs (`inputs`): `embedding_mlp`, `transformer`, or a factory called as
factory(input_spec, num_outputs, **options) with the `InputSpec` describing every input (name, kind,
width, cardinality, pad); the network takes the dict of tensors keyed by input name.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
from torch import nn

from blocksync.engine.config import REGISTRY, ModelSpec, is_custom
from blocksync.engine.inputs import InputSpec


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


class EmbeddingMLP(nn.Module):
    """Numeric inputs as they are and each categorical input through its own embedding, side by side
    (in input order) into an `mlp`. An embedding is `embedding_dim` wide, or by default
    min(50, (cardinality + 1) // 2) (the fast.ai rule of thumb)."""

    def __init__(self, spec: InputSpec, num_outputs: int, hidden: list[int], dropout: float = 0.0,
                 embedding_dim: int | None = None) -> None:
        super().__init__()
        tokens = [i.name for i in spec.inputs if i.kind == "tokens"]
        if tokens:
            raise ValueError(f"model 'embedding_mlp' reads numeric and categorical inputs; {tokens} are tokens: "
                             "use model 'transformer' for token sequences, or make them categorical.")
        self.order = [(i.name, i.kind) for i in spec.inputs]
        dims = {i.name: (int(i.cardinality or 1), embedding_dim or min(50, (int(i.cardinality or 1) + 1) // 2))
                for i in spec.inputs if i.kind == "categorical"}
        self.embeddings = nn.ModuleDict({name: nn.Embedding(*shape) for name, shape in dims.items()})
        width = spec.float_width + sum(dim for _, dim in dims.values())
        self.mlp = mlp(width, num_outputs, hidden, dropout)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.embeddings[name](inputs[name]) if kind == "categorical" else inputs[name]
                 for name, kind in self.order]
        return self.mlp(torch.cat(parts, dim=1))


class TokenTransformer(nn.Module):
    """A small encoder classifier over one tokens input: token and learned position embeddings, a
    `layers`-deep nn.TransformerEncoder (pre-norm off, ReLU, batch first), the mean over the positions
    that are not padding (its `pad` id; every position without one), and a linear head."""

    def __init__(self, spec: InputSpec, num_outputs: int, d_model: int = 32, heads: int = 4, layers: int = 2,
                 dim_feedforward: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        tokens = [i for i in spec.inputs if i.kind == "tokens"]
        if len(tokens) != 1 or len(spec.inputs) != 1:
            raise ValueError(f"model 'transformer' reads exactly one tokens input; the inputs are "
                             f"{[(i.name, i.kind) for i in spec.inputs]}: keep one tokens input.")
        self.name, self.pad = tokens[0].name, tokens[0].pad
        self.tokens = nn.Embedding(int(tokens[0].cardinality or 1), d_model)
        self.positions = nn.Embedding(tokens[0].width, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_outputs)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = inputs[self.name]
        h = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        padding = ids == self.pad if self.pad is not None else torch.zeros_like(ids, dtype=torch.bool)
        h = self.encoder(h, src_key_padding_mask=padding if self.pad is not None else None)
        keep = (~padding).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


TYPED = ("embedding_mlp", "transformer")


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


def build_model(spec: ModelSpec, num_features: int, num_outputs: int, inputs: InputSpec | None = None) -> nn.Module:
    """The network `spec` names, with default (unseeded) initialization; `inputs`: typed inputs."""
    if inputs is not None:
        return _build_typed(spec, inputs, num_outputs)
    if spec.name in TYPED:
        raise ValueError(f"model.name={spec.name!r} reads typed inputs; name them (inputs= in train(), data.inputs "
                         "in a run config, the estimator's inputs Param), or use logreg, mlp or cnn.")
    if spec.name == "logreg":
        return logreg(num_features, num_outputs)
    if spec.name == "mlp":
        return mlp(num_features, num_outputs, spec.hidden, spec.dropout)
    if spec.name == "cnn":
        return SmallCNN(num_features, num_outputs, spec.image_shape)
    return _call_factory(spec, num_features, str(num_features), num_outputs, "(num_features, num_outputs, **options)")


TYPED_OPTIONS = {"embedding_mlp": "embedding_dim", "transformer": "d_model, heads, layers, dim_feedforward"}


def _build_typed(spec: ModelSpec, inputs: InputSpec, num_outputs: int) -> nn.Module:
    if spec.name in TYPED:
        try:
            if spec.name == "embedding_mlp":
                return EmbeddingMLP(inputs, num_outputs, spec.hidden, spec.dropout, **spec.options)
            return TokenTransformer(inputs, num_outputs, **{"dropout": spec.dropout, **spec.options})
        except (TypeError, AssertionError) as err:  # an unknown option, or torch's d_model % heads check
            raise ValueError(f"model.options={spec.options} do not fit model {spec.name!r} ({err}); its options are "
                             f"{TYPED_OPTIONS[spec.name]}.") from err
    if spec.name in REGISTRY:
        raise ValueError(f"model.name={spec.name!r} reads one float feature matrix, but typed inputs were given; "
                         "use embedding_mlp, transformer or a factory 'package.module:factory(input_spec, "
                         "num_outputs)', or drop the inputs.")
    takes = "(input_spec, num_outputs, **options) with typed inputs"
    return _call_factory(spec, inputs, "input_spec", num_outputs, takes)


def _call_factory(spec: ModelSpec, first: int | InputSpec, shown: str, num_outputs: int, takes: str) -> nn.Module:
    """A user's `package.module:factory` called as factory(first, num_outputs, **options), checked."""
    factory = _import_factory(spec.name)
    try:
        model = factory(first, num_outputs, **spec.options)
    except Exception as err:  # the user's code: say what we called it with
        raise ValueError(
            f"model.name={spec.name!r}: calling it as factory({shown}, {num_outputs}, **model.options) failed "
            f"({type(err).__name__}: {err}); a factory takes {takes} and returns a torch.nn.Module."
        ) from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.name={spec.name!r} returned {type(model).__name__}, not a torch.nn.Module.")
    return model


def check_importable(spec: ModelSpec) -> None:
    """A custom `package.module:factory` must import and be callable (checked before any slow stage)."""
    if is_custom(spec):
        _import_factory(spec.name)


def validate_spec(spec: ModelSpec, num_features: int, num_outputs: int, inputs: InputSpec | None = None) -> None:
    """Build once on the driver and run a probe forward pass on two zero rows, so a bad spec, or a
    network whose output width is not `num_outputs`, fails before any barrier task starts."""
    model = build_model(spec, num_features, num_outputs, inputs)
    model.eval()
    probe: torch.Tensor | dict[str, torch.Tensor] = torch.zeros(2, num_features)
    takes = f"[batch, {num_features}] float features"
    if inputs is not None:
        probe = inputs.probe(2)
        takes = "a dict of tensors keyed by input name (" + ", ".join(
            f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in probe.items()) + ")"
    try:
        with torch.no_grad():
            out = model(probe)
    except Exception as err:
        raise ValueError(
            f"model.name={spec.name!r}: a forward pass on a probe batch of 2 rows failed "
            f"({type(err).__name__}: {err}); the network must take {takes}."
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


def module_from_bytes(spec: ModelSpec, num_features: int, num_outputs: int, weights: bytes,
                      inputs: InputSpec | None = None) -> nn.Module:
    """The network `spec` names with `weights` (safetensors bytes, see `state_bytes`) loaded, in eval mode."""
    from safetensors.torch import load

    module = build_model(spec, num_features, num_outputs, inputs)
    module.load_state_dict(load(weights))
    return module.eval()
