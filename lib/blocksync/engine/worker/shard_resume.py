"""Resuming a shard=optimizer run from its checkpoint, on the same or another number of workers.

The same number: each rank reloads its own saved slice (bitwise). Another number: each rank cuts
its new slice out of the saved slices it overlaps (`sharding.reshard`), and rank 0 takes over the
old ranks' summed epoch statistics and traffic.
"""

from __future__ import annotations

import torch

from blocksync.engine import checkpoint
from blocksync.engine.comm.sharding import Layout, ShardedOptimizer, reshard, shards_needed


def load_shard(sharded: ShardedOptimizer, path: str, snap: checkpoint.Snapshot) -> None:
    """This rank's slice of a sharded checkpoint's optimizer state: its own saved slice when the shard count
    is unchanged (bitwise), else cut from the saved slices it overlaps."""
    assert snap.zero is not None
    old, new = Layout(**snap.zero), sharded.layout
    if old.num_params != new.num_params:
        raise checkpoint.CheckpointError(f"checkpoint {path} holds {old.num_params} sharded parameters but the "
                                         f"model has {new.num_params}; point checkpoint.dir elsewhere.")
    index = sharded.index
    needed = [index] if old == new else shards_needed(old, new, index)
    shards = {k: checkpoint.read_part(path, f"zero-{k:05d}") for k in needed}
    tensors = shards[index] if old == new else reshard(shards, old, new, index)
    sharded.load_state(tensors, snap.optimizer["param_groups"])


def resharded_rank_state(path: str, zero: dict[str, int], rank: int) -> dict[str, torch.Tensor]:
    """Resuming on another num_workers: rank 0 carries the old ranks' summed epoch statistics and traffic
    (the epoch's global loss and the run's bytes stay whole), the others start them at zero; the best
    weights of early stopping are the same on every old rank."""
    parts = [checkpoint.read_part(path, f"rank-{r:05d}") for r in range(zero["num_shards"])]
    state = {"epoch_stats": torch.zeros(3, dtype=torch.float64), "traffic": torch.zeros(2, dtype=torch.float64)}
    if rank == 0:
        for part in parts:
            state["epoch_stats"] += part["epoch_stats"]
            state["traffic"] += part.get("traffic", torch.zeros(2, dtype=torch.float64))
    if "best_params" in parts[0]:
        state["best_params"] = parts[0]["best_params"]
    return state
