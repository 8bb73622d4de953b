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


STEP_PIECE = 1 << 20
"""Entries of one tensor the sharded optimizer steps (4 MiB of float32): Adam's temporaries are two of these.
(Pieces of 16 MiB measured ~50 MiB more RssAnon: glibc keeps freed blocks under 32 MiB in its heap.)"""
STAGE_BYTES = 16 << 20
"""Bytes of one staged round of Horovod's reduce-scatter (`ShardedOptimizer._staged_reduce_scatter`)."""


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps between steps (Adam's two moments, SGD's momentum)."""
    return sum(v.numel() * v.element_size() for entry in optimizer.state.values()
               for v in entry.values() if torch.is_tensor(v))


class ShardedOptimizer:
    """The optimizer of one rank's slice, with no copy of the parameters: the model's parameters become views
    of one flat buffer (`flat_param`, padded to N slices), and the optimizer steps views of this rank's slice of
    it, in pieces of at most STEP_PIECE entries (a step's temporaries, such as Adam's denominator, are one
    piece's, not the slice's). The gradients are views of one flat buffer too (`gradient_views`). After the
    step, every rank broadcasts its slice in place into everyone's buffer (`Collective.allgather_in_place`).
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, coll: Collective) -> None:
        self.coll = coll
        self.layout = Layout(sum(p.numel() for p in model.parameters()), coll.size)
        self.index = coll.shard_index
        self.flat_param = flatten_into_views(list(model.parameters()), self.layout.padded)
        chunk, at = self.layout.chunk, self.index * self.layout.chunk
        self.pieces = [(a, min(a + STEP_PIECE, chunk)) for a in range(0, chunk, STEP_PIECE)]
        # Each piece is a Parameter sharing the flat buffer's storage: the optimizer's in-place update is the
        # model's new weights (no master copy: the parameters are float32 already).
        self.params = [torch.nn.Parameter(self.flat_param[at + a:at + b]) for a, b in self.pieces]
        self.optimizer = build_optimizer(self.params, cfg)
        # Horovod's reduce-scatter returns a new tensor: its pieces land in this preallocated slice. The
        # in-place all-reduce fallback (and a single rank, which has nothing to scatter, and overlap, whose
        # buckets all-reduce during backward) leaves the summed slice in the flat gradient itself (views of it).
        self.grad_slice = torch.zeros(chunk, dtype=self.flat_param.dtype, device=self.flat_param.device) \
            if coll.native_reduce_scatter and coll.size > 1 and not cfg.overlaps else None
        self.stage_rows = min(chunk, max(1, STAGE_BYTES // (4 * coll.size)))  # entries of each slice per round
        self.stage = torch.empty(coll.size * self.stage_rows if self.grad_slice is not None else 0,
                                 dtype=self.flat_param.dtype, device=self.flat_param.device)

    def gradient_views(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One gradient tensor per parameter, each a view of one flat buffer padded to N slices (zero
        padding): backward accumulates into it in place (as DDP's gradient_as_bucket_view), so the exchange
        sends it without packing a copy."""
        self.flat_grad = torch.zeros(self.layout.padded, dtype=params[0].dtype, device=params[0].device)
        views, at = [], 0
        for p in params:
            views.append(self.flat_grad[at:at + p.numel()].view_as(p))
            at += p.numel()
        summed = self.grad_slice if self.grad_slice is not None else self.flat_grad[
            self.index * self.layout.chunk:(self.index + 1) * self.layout.chunk]
        for param, (a, b) in zip(self.params, self.pieces, strict=True):
            param.grad = summed[a:b]
        return views

    def exchange(self, total: float) -> tuple[float, float]:
        """Reduce-scatter every rank's contribution (its gradients, divided in place by the global batch
        `total`: the bits of the replicated path's division) into this slice's gradient. The flat buffer may
        be overwritten (the fallback all-reduces in place); the next step zeroes it. Returns (payload, wire)
        bytes of this step: the reduce-scatter's and the coming all-gather's."""
        self.flat_grad.div_(total)
        if self.grad_slice is not None:
            self._staged_reduce_scatter()
        else:  # all-reduce in place, then the optimizer reads its slice of it (views)
            summed = self.coll.allreduce_sum(to_collective(self.coll, self.flat_grad))
            if summed.data_ptr() != self.flat_grad.data_ptr():  # staged through host memory (CUDA, Gloo)
                self.flat_grad.copy_(summed)
        scatter, gather = self.layout.padded * 4, self.layout.chunk * 4
        wire = self.coll.bytes_per_reduce_scatter(scatter) + self.coll.bytes_per_allgather(gather)
        return float(scatter + gather), wire

    def gather_bytes(self) -> tuple[float, float]:
        """(payload, wire) bytes of one gather of the slices (with overlap, all the sharded path adds)."""
        gather = self.layout.chunk * 4
        return float(gather), self.coll.bytes_per_allgather(gather)

    def _staged_reduce_scatter(self) -> None:
        """Horovod's reduce-scatter copies its whole input into a temporary buffer (it reduces in place and
        the output is smaller): fed the flat gradient at once, that is one more copy of it. So it goes in
        rounds of at most STAGE_BYTES: round k packs entries [a, b) of every slice into a small staging
        buffer (allocated once) and receives entries [a, b) of this rank's slice. The bytes sent are the
        same in total."""
        assert self.grad_slice is not None
        grads = self.flat_grad.view(self.layout.num_shards, self.layout.chunk)
        for a in range(0, self.layout.chunk, self.stage_rows):
            b = min(a + self.stage_rows, self.layout.chunk)
            stage = self.stage[:grads.shape[0] * (b - a)].view(grads.shape[0], b - a)
            stage.copy_(grads[:, a:b])
            self.grad_slice[a:b].copy_(self.coll.reduce_scatter_sum(to_collective(self.coll, stage.reshape(-1))))

    def step(self) -> float:
        """Step this slice (in the flat buffer, so in the model), then gather every rank's slice into it in
        place; returns the seconds the gather took (communication, not optimizer time)."""
        self.optimizer.step()
        t0 = time.perf_counter()
        gathered = self.coll.allgather_in_place(to_collective(self.coll, self.flat_param))
        if gathered.data_ptr() != self.flat_param.data_ptr():  # staged through host memory (CUDA, Gloo)
            self.flat_param.copy_(gathered)
        return time.perf_counter() - t0

    def state(self) -> dict[str, torch.Tensor]:
        """This slice's optimizer tensors (`zero/<key>`, each one flat tensor of the slice whatever the pieces)
        and its index, for the rank's checkpoint file."""
        entries = [self.optimizer.state.get(p, {}) for p in self.params]
        out: dict[str, torch.Tensor] = {}
        for key, first in entries[0].items():
            if not torch.is_tensor(first):
                continue
            parts = [e[key].detach().cpu() for e in entries]
            out[f"zero/{key}"] = parts[0].contiguous() if first.dim() == 0 or len(parts) == 1 else torch.cat(parts)
        out["zero/index"] = torch.tensor([self.index, self.layout.num_shards, self.layout.num_params])
        return out

    def load_state(self, tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> None:
        """Restore a slice's optimizer tensors (as `state` wrote them, or as `reshard` cut them), cut into
        this run's pieces. Scalars are cloned per piece: Adam increments its step count in place."""
        entry = {k.removeprefix("zero/"): v for k, v in tensors.items() if k.startswith("zero/") and k != "zero/index"}
        state = {i: {k: v.clone() if v.dim() == 0 else v[a:b] for k, v in entry.items()}
                 for i, (a, b) in enumerate(self.pieces)} if entry else {}
        groups = [{**g, "params": list(range(len(self.params)))} for g in param_groups]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})


def flatten_into_views(params: list[torch.Tensor], padded: int) -> torch.Tensor:
    """One flat buffer of `padded` entries holding the parameters' values, each parameter made a view of it.
    Parameter by parameter, so the old storage of each is freed as it moves (about one copy of the largest
    parameter more at once, not of all)."""
    flat = torch.empty(padded, dtype=params[0].dtype, device=params[0].device)
    at = 0
    with torch.no_grad():
        for p in params:
            view = flat[at:at + p.numel()]
            view.copy_(p.reshape(-1))
            p.data = view.view_as(p)
            at += p.numel()
        flat[at:].zero_()  # the padding: zero gradients keep it zero under every optimizer
    return flat


def all_finite(flat: torch.Tensor) -> bool:
    """Whether every entry is finite, checked a piece at a time (no flag tensor as long as the buffer)."""
    return all(bool(torch.isfinite(flat[a:a + STEP_PIECE]).all()) for a in range(0, flat.numel(), STEP_PIECE))


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


def training_state_bytes(num_params: int, cfg: TrainConfig, num_shards: int, largest: int = 0) -> dict[str, int]:
    """What a rank allocates for training beyond its model's parameters (and an optimizer with no state yet),
    by part, in bytes (float32), at its peak; `largest`: the largest parameter's entries.

    - gradients: replicated, one per parameter; sharded, the flat buffer padded to N slices, and on Horovod at
      N > 1 the slice its reduce-scatter sums into and the staging buffer of its rounds; with overlap, also
      the buckets' buffers (as much again);
    - optimizer: its state, whole replicated, the slice's sharded;
    - transient: the largest of what lives only in one phase of a step: backward's gradient of the largest
      parameter before it is added into the buffer; replicated, the flat exchange's packed buffer and its
      division's result (not with overlap), and Adam's temporaries of the largest parameter; sharded,
      Horovod's copy of a staged round and its output (torch_gloo all-reduces in place), and Adam's
      temporaries of one piece.

    The flat parameter buffer of a sharded run replaces the model's parameters; the gather is in place."""
    per_param = {"adam": 2, "adamw": 2}.get(cfg.optimizer, 1 if cfg.momentum else 0)
    backward = 4 * largest
    buckets = 4 * num_params if cfg.overlaps else 0  # overlap: every bucket's buffer, kept from step to step
    if cfg.shard == "optimizer":
        layout = Layout(num_params, num_shards)
        step = 2 * 4 * min(layout.chunk, STEP_PIECE)
        native = cfg.backend == "horovod" and num_shards > 1 and not cfg.overlaps
        stage = 4 * num_shards * min(layout.chunk, max(1, STAGE_BYTES // (4 * num_shards))) if native else 0
        return {"gradients": 4 * layout.padded + buckets + (4 * layout.chunk + stage if native else 0),
                "optimizer": 4 * layout.chunk * per_param,
                "transient": max(stage + stage // num_shards, step, backward)}
    flat = 0 if cfg.overlaps else 8 * num_params  # the flat path's packed buffer and its division's result
    return {"gradients": 4 * num_params + buckets, "optimizer": 4 * num_params * per_param,
            "transient": max(flat, 2 * 4 * largest, backward)}
