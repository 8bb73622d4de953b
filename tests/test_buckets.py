"""Gradient buckets overlapped with backward, without Spark: the bucket cut, the launch order, and the
overlapped result against the flat all-reduce on a real torch.distributed Gloo group (2 and 4 processes)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from blocksync.engine.comm.buckets import GradientBuckets, plan_buckets
from blocksync.engine.comm.collectives import Collective, PendingReduce, TorchGlooCollective

pytestmark = pytest.mark.timeout(120)


def test_buckets_are_cut_from_parameter_order_and_sizes():
    # Reverse registration order; a bucket closes once it holds >= 40 bytes (10 float32).
    assert plan_buckets([6, 2, 3, 20, 4], bucket_bytes=40) == [[4, 3], [2, 1, 0]]
    assert plan_buckets([6, 2, 3, 20, 4], bucket_bytes=8) == [[4], [3], [2], [1], [0]]
    assert plan_buckets([6, 2, 3, 20, 4], bucket_bytes=10**9) == [[4, 3, 2, 1, 0]]


class RecordingCollective(Collective):
    """One rank (the sum is the input); records the order all-reduces start in, and holds them in flight
    until waited for."""

    def __init__(self, in_flight: int | None = None) -> None:
        super().__init__(0, 1)
        self.overlap_in_flight = in_flight
        self.started: list[str] = []
        self.waiting = 0
        self.most_waiting = 0

    def allreduce_sum(self, flat, fp16=False):
        return flat

    def start_allreduce(self, flat, fp16=False, tag=""):
        self.started.append(tag)
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        done = flat.clone()

        def wait():
            self.waiting -= 1
            return done
        return PendingReduce(lambda: False, wait)

    def allgather(self, tensor):
        return tensor

    def broadcast(self, flat, root=0):
        return flat


def model_with_grads() -> tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    params = list(model.parameters())
    grads = [torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    return model, params, grads


def local_loss(model: torch.nn.Module, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(24, 8, generator=gen), torch.randint(0, 3, (24,), generator=gen)
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum")


@pytest.mark.parametrize("in_flight", [None, 1])
def test_buckets_start_in_bucket_order_and_divide_like_the_flat_path(in_flight):
    model, params, grads = model_with_grads()
    coll = RecordingCollective(in_flight)
    buckets = GradientBuckets(coll, params, grads, bucket_mb=150 / 2**20)  # 150 bytes: several buckets
    assert len(buckets.buckets) >= 3
    local_loss(model, 0).backward()  # not armed: the hooks do nothing
    assert coll.started == []
    expected = torch.cat([g.reshape(-1) for g in grads]) / 24.0
    for g in grads:
        g.zero_()
    buckets.arm(24.0)
    local_loss(model, 0).backward()
    if in_flight == 1:  # nothing finished during backward, so only the first bucket could start
        assert coll.started == ["bucket0"]
    done = buckets.finish()
    assert coll.started == [f"bucket{b}" for b in range(len(buckets.buckets))]
    assert coll.most_waiting == (1 if in_flight == 1 else len(buckets.buckets))
    assert torch.equal(torch.cat([g.reshape(-1) for g in grads]), expected)  # the same division, bitwise
    assert done.finite and done.payload_bytes == expected.numel() * 4


def test_gradients_arriving_out_of_order_still_start_in_bucket_order():
    _, params, grads = model_with_grads()
    coll = RecordingCollective()
    buckets = GradientBuckets(coll, params, grads, bucket_mb=150 / 2**20)
    buckets.arm(1.0)
    last = buckets.buckets[-1]
    for index in last:  # the last bucket fills first: it must wait for the ones before it
        buckets._hook_for(index)(params[index])
    assert coll.started == []
    for members in buckets.buckets[:-1]:
        for index in members:
            buckets._hook_for(index)(params[index])
    assert coll.started == [f"bucket{b}" for b in range(len(buckets.buckets))]
    buckets.finish()


def test_an_empty_local_batch_exchanges_zeros():
    _, params, grads = model_with_grads()
    coll = RecordingCollective()
    buckets = GradientBuckets(coll, params, grads, bucket_mb=150 / 2**20)
    buckets.arm(0.0)  # no rows anywhere: zeros, not 0/0
    done = buckets.finish()
    assert done.finite and all(not g.any() for g in grads)
    assert len(coll.started) == len(buckets.buckets)


def _flat_against_buckets(rank: int, size: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=size)
    try:
        coll = TorchGlooCollective.__new__(TorchGlooCollective)
        Collective.__init__(coll, rank, size)
        coll._dist = dist
        model, params, grads = model_with_grads()
        buckets = GradientBuckets(coll, params, grads, bucket_mb=150 / 2**20)
        total = 24.0 * size
        local_loss(model, rank).backward()
        flat = coll.allreduce_sum(torch.cat([g.reshape(-1) for g in grads]) / total).clone()
        for g in grads:
            g.zero_()
        buckets.arm(total)
        local_loss(model, rank).backward()
        buckets.finish()
        torch.save({"flat": flat, "buckets": torch.cat([g.reshape(-1) for g in grads])},
                   os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 4])
def test_overlapped_buckets_equal_the_flat_all_reduce(tmp_path, size):
    mp.start_processes(_flat_against_buckets, args=(size, str(tmp_path / "store"), str(tmp_path)), nprocs=size,
                       start_method="spawn")
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(size)]
    for r in results[1:]:  # every rank holds the same bits, either way
        assert torch.equal(r["flat"], results[0]["flat"]) and torch.equal(r["buckets"], results[0]["buckets"])
    flat, bucketed = results[0]["flat"], results[0]["buckets"]
    if size == 2:  # each element is one addition a + b, commutative: bitwise
        assert torch.equal(flat, bucketed)
    else:  # the ring's chunk boundaries move with the bucket cut: float32 rounding only
        assert torch.allclose(flat, bucketed, rtol=1e-6, atol=1e-7)


def test_a_frozen_parameter_has_no_hook_and_does_not_hold_its_bucket_back():
    model, params, grads = model_with_grads()
    params[0].requires_grad_(False)  # the first layer's weight: in the last bucket
    coll = RecordingCollective()
    buckets = GradientBuckets(coll, params, grads, bucket_mb=150 / 2**20)
    buckets.arm(24.0)
    local_loss(model, 0).backward()
    assert coll.started == [f"bucket{b}" for b in range(len(buckets.buckets))]  # all started during backward
    buckets.finish()
    assert not grads[0].any()  # the frozen weight's gradient stayed zero
