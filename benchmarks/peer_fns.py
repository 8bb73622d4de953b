"""The training functions the peers run on their workers: the same MLP, optimizer, batch and epochs as blocksync.

Each rank reads its own Parquet shards (files rank, rank + size, ...), shuffles
its rows every epoch with a seeded permutation, and takes `batch // size` rows
per step; gradients are averaged over ranks every step (DDP's bucketed
all-reduce, or Horovod's DistributedOptimizer). Rank 0 returns its state_dict
as numpy arrays. Imported by executors (benchmarks/__main__.py puts the
repository on their PYTHONPATH).
"""

from __future__ import annotations

from typing import Any


def _shard(files: list[str], rank: int, size: int):
    import torch

    from benchmarks.data import load_numpy

    x, y = load_numpy(files[rank::size])
    return torch.from_numpy(x), torch.from_numpy(y)


def _epochs(model, opt, x, y, *, batch: int, epochs: int, seed: int, rank: int) -> None:
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    steps = x.shape[0] // batch  # equal shards: every rank takes the same number of steps
    for epoch in range(epochs):
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + 1000 * epoch + rank))
        for step in range(steps):
            idx = order[step * batch:(step + 1) * batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()


def _model(hidden: list[int], features: int):
    import torch

    from blocksync.engine.config import ModelSpec
    from blocksync.engine.models import build_model

    torch.manual_seed(0)
    return build_model(ModelSpec(name="mlp", hidden=hidden), features, 2)


def ddp_train(files: list[str], hidden: list[int], features: int, batch: int, epochs: int, lr: float) -> Any:
    """For TorchDistributor: torchrun has set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""
    import atexit
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        x, y = _shard(files, rank, size)
        model = DistributedDataParallel(_model(hidden, features))  # broadcasts rank 0's initial weights
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        _epochs(model, opt, x, y, batch=batch // size, epochs=epochs, seed=0, rank=rank)
        state = {k: v.detach().numpy().copy() for k, v in model.module.state_dict().items()}
    finally:
        dist.destroy_process_group()
    # About 1 run in 5 aborted at interpreter exit here ("terminate called without an active
    # exception"), and the other node's torchrun then waited 300 s for it: leave without teardown
    # once the result is in hand, as the peer's user would have to.
    atexit.register(os._exit, 0)
    return state if rank == 0 else None


def horovod_train(files: list[str], hidden: list[int], features: int, batch: int, epochs: int, lr: float) -> Any:
    """For horovod.spark.run: hvd.init() finds its rank from the environment horovod.spark sets."""
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    try:
        rank, size = hvd.rank(), hvd.size()
        x, y = _shard(files, rank, size)
        model = _model(hidden, features)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        _epochs(model, opt, x, y, batch=batch // size, epochs=epochs, seed=0, rank=rank)
        state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    finally:
        hvd.shutdown()
    return state if rank == 0 else None
