"""engine.optim: Adam and AdamW step as torch's fused kernel, elementwise, so slices step as the whole."""

from __future__ import annotations

import pytest
import torch

from blocksync import ModelSpec, TrainConfig
from blocksync.engine.models import build_model
from blocksync.engine.optim import build_optimizer, fusable


def steps(params: list[torch.Tensor], optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> torch.Tensor:
    for g in grads:
        offset = 0
        for p in params:
            p.grad = g[offset:offset + p.numel()].clone()
            offset += p.numel()
        optimizer.step()
    return torch.cat([p.detach() for p in params])


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_is_fused_and_a_slice_steps_bitwise_as_the_whole(name):
    config = TrainConfig(optimizer=name, lr=1e-3, weight_decay=1e-4)
    model = build_model(ModelSpec(name="mlp", hidden=[16]), 4, 2, None)
    assert build_optimizer(model, config).defaults["fused"] is True
    torch.manual_seed(0)
    start, grads = torch.randn(1001), [torch.randn(1001) for _ in range(20)]
    whole = [start.clone().requires_grad_()]
    pieces = [start[a:b].clone().requires_grad_() for a, b in ((0, 7), (7, 500), (500, 1001))]
    stepped = steps(whole, build_optimizer(whole, config), grads)
    assert torch.equal(stepped, steps(pieces, build_optimizer(pieces, config), grads))  # what sharding relies on
    # Against torch's for-loop implementation (what tests/reference.py steps): rounding only.
    plain = [start.clone().requires_grad_()]
    loop = (torch.optim.Adam if name == "adam" else torch.optim.AdamW)(plain, lr=1e-3, weight_decay=1e-4)
    assert float((stepped - steps(plain, loop, grads)).abs().max()) <= 1e-6


def test_only_floating_point_tensors_on_cpu_or_cuda_are_fused():
    assert fusable([torch.zeros(3), torch.zeros(2, dtype=torch.float64)])
    assert not fusable([torch.zeros(3, dtype=torch.int64)]) and not fusable([])
    assert not fusable([torch.zeros(3, device="meta")])
