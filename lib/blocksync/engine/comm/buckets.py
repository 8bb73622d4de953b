"""Gradient buckets all-reduced during backward (`train.overlap`), started from autograd hooks.

`plan_buckets` fixes the buckets from the parameters' order and sizes; `GradientBuckets` launches
each bucket's all-reduce as its gradients become ready and waits for them before the optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from blocksync.engine.comm.collectives import Collective, PendingReduce


def plan_buckets(numels: list[int], bucket_bytes: int, element_bytes: int = 4) -> list[list[int]]:
    """Parameter indices per bucket: reverse registration order (roughly the order backward produces
    gradients), a bucket closing once it holds at least `bucket_bytes` (a larger parameter fills one
    alone). Only the parameters' order and sizes decide, never the order gradients arrive in, so
    every rank and every run cuts the same buckets."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in reversed(range(len(numels))):
        current.append(index)
        size += numels[index] * element_bytes
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class BucketTraffic:
    payload_bytes: int
    wire_bytes: float
    finite: bool


class GradientBuckets:
    """The step's gradient exchange in buckets, overlapped with backward.

    Each step: `arm(global_batch)` before backward; a post-accumulate-grad hook on every parameter
    counts its bucket's ready gradients; a full bucket is flattened, divided by the step's global
    batch size (every rank knows it before the step) and its all-reduce started, asynchronously.
    Buckets start strictly in bucket order: one that fills early waits for those before it, so every
    rank issues the same collectives in the same order (torch.distributed requires it). `finish()`
    starts what backward did not (an empty local batch, a parameter the forward pass did not use),
    waits in bucket order, and writes the global mean gradient into the gradient tensors.

    `max_in_flight` (the collective's `overlap_in_flight`): Horovod fuses tensors that become ready
    in the same cycle into one buffer, which moves a ring's chunk boundaries with the timing; one
    bucket in flight at a time keeps its results the same from run to run.

    Against the flat path (one all-reduce of every gradient) the division is the same per element
    and only the summation order can differ: a ring adds a chunk's elements in an order set by where
    the chunk boundaries fall, and bucket boundaries move them. At 2 workers each element is one
    addition a + b, which is commutative, so the result is bitwise the flat path's; the spark
    backend adds in rank order at any size (but is refused with overlap: each allGather blocks).
    At 3 or more workers on a ring (horovod, torch_gloo) the two agree within float32 rounding
    (1e-6 relative), and each is bitwise reproducible run to run and through a relaunch.

    fp16 compression works per bucket (it is elementwise); the compressors with state over the whole
    gradient (topk, int8, powersgd) are refused with overlap by `TrainConfig`.
    """

    def __init__(self, coll: Collective, params: Sequence[torch.Tensor], grads: list[torch.Tensor], *,
                 bucket_mb: float, fp16: bool = False) -> None:
        self.coll, self.grads, self.fp16 = coll, grads, fp16
        self.buckets = plan_buckets([p.numel() for p in params], max(1, int(bucket_mb * 1024 * 1024)))
        self.bucket_of = {index: b for b, members in enumerate(self.buckets) for index in members}
        on_gpu = grads[0].device.type == "cuda"
        staged = on_gpu and not coll.device_tensors  # CUDA gradients, a collective that reduces host memory
        device = torch.device("cpu") if staged else grads[0].device
        self.buffers = [torch.empty(sum(grads[i].numel() for i in members), device=device, pin_memory=staged)
                        for members in self.buckets]
        # On the GPU the buckets are flattened, divided and (for Gloo) copied to host on their own stream,
        # so backward's kernels go on meanwhile on the default one.
        self.stream = torch.cuda.Stream(grads[0].device) if on_gpu else None
        self.max_in_flight = coll.overlap_in_flight or len(self.buckets)
        self.divisor = 1.0
        self.armed = False
        self.ready = [0] * len(self.buckets)
        self.pending: list[PendingReduce] = []
        # A frozen parameter gets no hook (torch refuses one) and never counts: its zeros go with its bucket.
        self.expected = [sum(params[i].requires_grad for i in members) for members in self.buckets]
        self.handles = [p.register_post_accumulate_grad_hook(self._hook_for(i))
                        for i, p in enumerate(params) if p.requires_grad]

    def _hook_for(self, index: int) -> Any:
        def hook(_param: torch.Tensor) -> None:
            if self.armed:
                self.ready[self.bucket_of[index]] += 1
                self._launch_ready()
        return hook

    def arm(self, global_batch: float) -> None:
        """Before backward: this step's divisor (a step without rows anywhere exchanges zeros, not 0/0)."""
        assert not self.pending, "the previous step's buckets were not finished"
        self.divisor = global_batch if global_batch > 0 else 1.0
        self.ready = [0] * len(self.buckets)
        self.armed = True

    def _launch_ready(self, force: bool = False) -> None:
        """Start the next buckets in order while they are full and the in-flight limit allows; `force`
        (after backward): start every remaining one, waiting for the oldest in flight where needed."""
        while len(self.pending) < len(self.buckets):
            b = len(self.pending)
            if not force and self.ready[b] < self.expected[b]:
                return
            in_flight = [p for p in self.pending if not p.finished]
            if len(in_flight) >= self.max_in_flight:
                if not force:
                    return
                in_flight[0].wait()
            with self._bucket_stream():  # Horovod with NCCL orders its all-reduce after the current stream
                self.pending.append(self.coll.start_allreduce(self._fill(b), fp16=self.fp16, tag=f"bucket{b}"))

    def _bucket_stream(self) -> Any:
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))  # backward's gradients so far
        return torch.cuda.stream(self.stream)

    def _fill(self, b: int) -> torch.Tensor:
        """Bucket `b`'s gradients, flattened into its buffer and divided by the global batch size."""
        buf, views = self.buffers[b], [self.grads[i].reshape(-1) for i in self.buckets[b]]
        if buf.device == views[0].device:
            torch.cat(views, out=buf)
            return buf.div_(self.divisor)
        # CUDA gradients, a collective that reduces host memory (Gloo): divided on the device, as the flat
        # path does, then copied into pinned memory, which Gloo may read once the copy has landed.
        buf.copy_(torch.cat(views).div_(self.divisor), non_blocking=True)
        assert self.stream is not None
        self.stream.synchronize()
        return buf

    def finish(self) -> BucketTraffic:
        """Start what is left, wait in bucket order, write the mean gradient into the gradient tensors."""
        self.armed = False
        self._launch_ready(force=True)
        if self.stream is not None:  # the copies back run on the default stream, after the buckets' work
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        payload, wire, finite = 0, 0.0, True
        for b, pending in enumerate(self.pending):
            mean = pending.wait()
            finite = finite and bool(torch.isfinite(mean).all())
            offset = 0
            for i in self.buckets[b]:
                g = self.grads[i]
                g.copy_(mean[offset:offset + g.numel()].view_as(g), non_blocking=True)
                offset += g.numel()
            sent = mean.numel() * (2 if self.fp16 else 4)
            payload += sent
            wire += self.coll.bytes_per_allreduce(sent)
        self.pending = []
        return BucketTraffic(payload, wire, finite)

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
