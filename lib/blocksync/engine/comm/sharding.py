"""Sharded optimizer state (ZeRO stage 1, train.shard=optimizer): each rank keeps 1/N of it.

`ShardedOptimizer` reduce-scatters the flat gradient, steps this rank's contiguous
slice of the flat parameters with that slice's optimizer state only, and
all-gathers the updated slices into every replica. `reshard` cuts saved shards
into another number of them (resuming on a different num_workers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from blocksync.engine.comm.collectives import to_collective
from blocksync.engine.optim import build_optimizer

if TYPE_CHECKING:
    from blocksync.engine.comm.collectives import Collective
    from blocksync.engine.config import TrainConfig


@dataclass(frozen=True)
class Layout:
    """How the flat parameter vector (num_params long, padded with zeros to num_shards x chunk) is cut:
    shard i holds entries [i * chunk, (i + 1) * chunk)."""

    num_params: int
    num_shards: int

    @property
    def chunk(self) -> int:
        return math.ceil(self.num_params / self.num_shards)

    @property
    def padded(self) -> int:
        return self.chunk * self.num_shards

    def bounds(self, index: int) -> tuple[int, int]:
        """[lo, hi) of shard `index` in the flat parameters (hi <= num_params: the padding is not a parameter)."""
        lo = min(index * self.chunk, self.num_params)
        return lo, min(lo + self.chunk, self.num_params)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps between steps (Adam's two moments, SGD's momentum)."""
    return sum(v.numel() * v.element_size() for entry in optimizer.state.values()
               for v in entry.values() if torch.is_tensor(v))


class ShardedOptimizer:
    """The optimizer of one rank's slice; the model's own parameters stay whole (they are the forward pass's).

    `param` is a float32 copy of this rank's slice (the master copy the optimizer updates); after each
    `step` the all-gathered slices overwrite the model's parameters, so the slice and the model agree.
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, coll: Collective) -> None:
        self.coll = coll
        self.layout = Layout(sum(p.numel() for p in model.parameters()), coll.size)
        self.index = coll.shard_index
        first = next(model.parameters())
        self.param = torch.nn.Parameter(torch.zeros(self.layout.chunk, dtype=first.dtype, device=first.device))
        self.take_params(model)
        self.grad = self.param.grad = torch.zeros_like(self.param)
        self.optimizer = build_optimizer([self.param], cfg)

    def take_params(self, model: torch.nn.Module) -> None:
        """Copy this rank's slice of the model's parameters into the master copy (at the start, and after a
        checkpoint replaced the model's parameters)."""
        lo, hi = self.layout.bounds(self.index)
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        with torch.no_grad():
            self.param.zero_()
            self.param[:hi - lo] = flat[lo:hi]

    def gradient_views(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One gradient tensor per parameter, each a view of one flat buffer padded to N slices (zero
        padding): backward accumulates into it in place (as DDP's gradient_as_bucket_view), so the exchange
        sends it without packing a copy."""
        self.flat_grad = torch.zeros(self.layout.padded, dtype=params[0].dtype, device=params[0].device)
        views, at = [], 0
        for p in params:
            views.append(self.flat_grad[at:at + p.numel()].view_as(p))
            at += p.numel()
        return views

    def exchange(self, total: float) -> tuple[float, float]:
        """Reduce-scatter every rank's contribution (its gradients, divided in place by the global batch
        `total`: the bits of the replicated path's division) into this slice's gradient. The buffer may be
        overwritten (the fallback all-reduces in place); the next step zeroes it. Returns (payload, wire)
        bytes of this step: the reduce-scatter's and the coming all-gather's."""
        self.flat_grad.div_(total)
        mine = self.coll.reduce_scatter_sum(to_collective(self.coll, self.flat_grad))
        self.grad.copy_(mine.to(self.param.device))
        scatter, gather = self.layout.padded * 4, self.layout.chunk * 4
        wire = self.coll.bytes_per_reduce_scatter(scatter) + self.coll.bytes_per_allgather(gather)
        return float(scatter + gather), wire

    def step(self) -> tuple[torch.Tensor, float]:
        """Step this slice, all-gather every slice; returns the whole flat parameters (num_params) and the
        seconds the all-gather took (communication, not optimizer time)."""
        self.optimizer.step()
        t0 = time.perf_counter()
        gathered = self.coll.allgather(to_collective(self.coll, self.param.detach()))
        seconds = time.perf_counter() - t0
        # All-gather output is in shard order, which is what the layout's slices follow.
        return gathered[: self.layout.num_params], seconds

    def state(self) -> dict[str, torch.Tensor]:
        """This slice's optimizer tensors (`zero/<key>`) and its index, for the rank's checkpoint file."""
        entry = self.optimizer.state.get(self.param, {})
        out = {f"zero/{k}": v.detach().cpu().contiguous() for k, v in entry.items() if torch.is_tensor(v)}
        out["zero/index"] = torch.tensor([self.index, self.layout.num_shards, self.layout.num_params])
        return out

    def load_state(self, tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> None:
        """Restore a slice's optimizer tensors (as `state` wrote them, or as `reshard` cut them)."""
        entry = {k.removeprefix("zero/"): v for k, v in tensors.items() if k.startswith("zero/") and k != "zero/index"}
        self.optimizer.load_state_dict({"state": {0: entry} if entry else {}, "param_groups": param_groups})


def reshard(shards: dict[int, dict[str, torch.Tensor]], old: Layout, new: Layout,
            index: int) -> dict[str, torch.Tensor]:
    """Slice `index` of `new` cut from the saved slices of `old` it overlaps (`shards`: old index -> its
    `state()` tensors). Scalars (Adam's step) are the same in every slice and taken from the first."""
    lo, hi = new.bounds(index)
    first = shards[min(shards)]
    out: dict[str, torch.Tensor] = {}
    for key, value in first.items():
        if key == "zero/index":
            continue
        if value.dim() == 0:  # a 0-d tensor: a scalar such as Adam's step count
            out[key] = value.clone()
            continue
        piece = torch.zeros(new.chunk, dtype=value.dtype)
        for k in shards_needed(old, new, index):
            o_lo, o_hi = old.bounds(k)
            a, b = max(lo, o_lo), min(hi, o_hi)
            if a < b:
                piece[a - lo:b - lo] = shards[k][key][a - o_lo:b - o_lo]
        out[key] = piece
    return out


def shards_needed(old: Layout, new: Layout, index: int) -> list[int]:
    """The old shard indices whose entries overlap slice `index` of `new`."""
    lo, hi = new.bounds(index)
    if hi <= lo:
        return [0]  # an all-padding slice: only the scalars are needed
    return list(range(lo // old.chunk, (hi - 1) // old.chunk + 1))


def training_state_bytes(num_params: int, cfg: TrainConfig, num_shards: int) -> dict[str, int]:
    """What a rank allocates for training beyond its model's parameters, by part, in bytes (float32):
    the gradients, the optimizer state (a 1/N slice of it and the slice's master copy with shard=optimizer),
    and the exchange's transient buffers (replicated: the flat buffer and its division's result;
    sharded: Horovod's copy of the gradient buffer in its reduce-scatter, or the gathered parameters)."""
    per_param = {"adam": 2, "adamw": 2}.get(cfg.optimizer, 1 if cfg.momentum else 0)
    if cfg.shard == "optimizer":
        chunk = Layout(num_params, num_shards).chunk
        return {"gradients": 4 * num_params, "optimizer": 4 * chunk * (per_param + 1),
                "exchange": 4 * chunk * num_shards}
    return {"gradients": 4 * num_params, "optimizer": 4 * num_params * per_param, "exchange": 8 * num_params}
