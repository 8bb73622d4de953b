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


class CodesAndNumbers(nn.Module):
    """A typed-inputs factory's network: one embedding per categorical input, the numeric inputs as they
    are. It refuses ids that are not int64, so a cast anywhere on the way fails the run."""

    def __init__(self, spec, num_outputs: int, dim: int = 3) -> None:
        super().__init__()
        self.kinds = {i.name: i.kind for i in spec.inputs}
        self.tables = nn.ModuleDict({i.name: nn.Embedding(i.cardinality, dim)
                                     for i in spec.inputs if i.kind == "categorical"})
        self.head = nn.Linear(spec.float_width + dim * len(self.tables), num_outputs)

    def forward(self, x):
        import torch

        for name, kind in self.kinds.items():
            want = torch.float32 if kind == "numeric" else torch.int64
            if x[name].dtype != want:
                raise TypeError(f"input {name!r} arrived as {x[name].dtype}, not {want}")
        return self.head(torch.cat([self.tables[n](x[n]) if n in self.tables else x[n] for n in self.kinds], 1))


def codes_and_numbers(spec, num_outputs: int, **options) -> nn.Module:
    """factory(input_spec, num_outputs): what blocksync calls with typed inputs."""
    return CodesAndNumbers(spec, num_outputs, **options)
