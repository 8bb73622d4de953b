"""The training functions the peers run on their workers: the same network, optimizer, batch and epochs as blocksync.

`net` describes the network: {"kind": "mlp", "hidden": [...], "features": F} (blocksync's mlp on the
float features of benchmarks/data.py) or benchmarks/tokens.NET (blocksync's transformer on the token ids
of benchmarks/tokens.py, behind a module that takes the id tensor). Each rank reads its own Parquet
shards (files rank, rank + size, ...), shuffles
its rows every epoch with a seeded permutation, and takes `batch // size` rows
per step; gradients are averaged over ranks every step (DDP's bucketed
all-reduce, or Horovod's DistributedOptimizer). Rank 0 returns its state_dict
as numpy arrays. Imported by executors (benchmarks/__main__.py puts the
repository on their PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

import torch


def load(files: list[str], net: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of `files`, in order: float features for the mlp, token ids for the transformer."""
    from benchmarks.data import load_numpy
    from benchmarks.tokens import load_tokens

    x, y = load_numpy(files) if net["kind"] == "mlp" else load_tokens(files)
    return torch.from_numpy(x), torch.from_numpy(y)


class TokenNet(torch.nn.Module):
    """blocksync's transformer (which takes a dict of inputs) fed the token id tensor itself."""

    def __init__(self, net: dict[str, Any]) -> None:
        from blocksync.engine.config import ModelSpec
        from blocksync.engine.inputs import Input, InputSpec
        from blocksync.engine.models import build_model

        super().__init__()
        tokens = Input("tokens", "tokens", cardinality=net["vocab"], pad=net["pad"], width=net["length"])
        self.net = build_model(ModelSpec(name="transformer", options=net["options"]), 0, 2, InputSpec((tokens,)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net({"tokens": ids})


def network(net: dict[str, Any]) -> torch.nn.Module:
    """The network `net` describes, initialized from seed 0."""
    from blocksync.engine.config import ModelSpec
    from blocksync.engine.models import build_model

    torch.manual_seed(0)
    if net["kind"] == "mlp":
        return build_model(ModelSpec(name="mlp", hidden=net["hidden"]), net["features"], 2)
    return TokenNet(net)


def state_of(model: torch.nn.Module) -> dict[str, Any]:
    """The state_dict as numpy arrays, under blocksync's own names (without DDP's or TokenNet's wrapper)."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, TokenNet)):
        model = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model.net
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _epochs(model, opt, x, y, *, batch: int, epochs: int, seed: int, rank: int) -> None:
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = x.shape[0] // batch  # equal shards: every rank takes the same number of steps
    for epoch in range(epochs):
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + 1000 * epoch + rank))
        for step in range(steps):
            idx = order[step * batch:(step + 1) * batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()


def ddp_train(files: list[str], net: dict[str, Any], batch: int, epochs: int, lr: float) -> Any:
    """For TorchDistributor: torchrun has set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""
    import atexit
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        x, y = load(files[rank::size], net)
        model = DistributedDataParallel(network(net))  # broadcasts rank 0's initial weights
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        _epochs(model, opt, x, y, batch=batch // size, epochs=epochs, seed=0, rank=rank)
        state = state_of(model)
    finally:
        dist.destroy_process_group()
    # About 1 run in 5 aborted at interpreter exit here ("terminate called without an active
    # exception"), and the other node's torchrun then waited 300 s for it: leave without teardown
    # once the result is in hand, as the peer's user would have to.
    atexit.register(os._exit, 0)
    return state if rank == 0 else None


def horovod_train(files: list[str], net: dict[str, Any], batch: int, epochs: int, lr: float) -> Any:
    """For horovod.spark.run: hvd.init() finds its rank from the environment horovod.spark sets."""
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    try:
        rank, size = hvd.rank(), hvd.size()
        x, y = load(files[rank::size], net)
        model = network(net)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        _epochs(model, opt, x, y, batch=batch // size, epochs=epochs, seed=0, rank=rank)
        state = state_of(model)
    finally:
        hvd.shutdown()
    return state if rank == 0 else None
