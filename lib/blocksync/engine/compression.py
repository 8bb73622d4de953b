"""Gradient compression for the per-step exchange: none, fp16, top-k, int8 (stochastic).

Every rank passes its *contribution* (its summed local gradient divided by the
global batch size, which every rank knows before the step) and receives the
global mean gradient, identical on every rank.

- `none`: one all-reduce of the float32 buffer.
- `fp16`: the buffer travels as float16 (Horovod's `Compression.fp16` on the
  horovod backend; a float16 all-reduce elsewhere) and is cast back.
- `topk`: error feedback adds the residual of earlier steps, the k = ratio x P
  largest magnitudes are kept (int32 indices, float16 values), the rest stays in
  the residual; indices and values are all-gathered and summed in rank order.
- `int8`: error feedback, then stochastic rounding to int8 with one float32
  scale per chunk of 4096 values; codes and scales are all-gathered and the
  dequantized contributions summed in rank order. The rounding noise is
  seeded per (seed, rank, step), so runs are repeatable.

`payload_bytes` is what one rank contributes per step (the message size S);
`wire_bytes` estimates what it sends: 2(N-1)/N x S for a ring all-reduce,
(N-1) x S for an all-gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from blocksync.engine.collectives import Collective
from blocksync.engine.config import COMPRESSIONS

CHUNK = 4096


@dataclass
class Exchange:
    mean_gradient: torch.Tensor
    payload_bytes: int
    wire_bytes: float


class Compressor:
    name = "none"

    def __init__(self, coll: Collective, num_params: int) -> None:
        self.coll = coll
        self.num_params = num_params

    def exchange(self, contribution: torch.Tensor, step: int) -> Exchange:
        out = self.coll.allreduce_sum(contribution)
        payload = contribution.numel() * 4
        return Exchange(out, payload, self.coll.bytes_per_allreduce(payload))

    def state(self) -> dict[str, torch.Tensor]:
        """What must survive a restart (error-feedback residuals)."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027 (no state by default)
        """Restore `state()`."""


class Fp16Compressor(Compressor):
    name = "fp16"

    def exchange(self, contribution: torch.Tensor, step: int) -> Exchange:
        out = self.coll.allreduce_sum(contribution, fp16=True)
        payload = contribution.numel() * 2
        return Exchange(out, payload, self.coll.bytes_per_allreduce(payload))


class _FeedbackCompressor(Compressor):
    """Shared error feedback: compress (contribution + residual), keep what was not sent."""

    def __init__(self, coll: Collective, num_params: int) -> None:
        super().__init__(coll, num_params)
        self.residual = torch.zeros(num_params)

    def state(self) -> dict[str, torch.Tensor]:
        return {"residual": self.residual.clone()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.residual = state["residual"].clone()


class TopKCompressor(_FeedbackCompressor):
    name = "topk"

    def __init__(self, coll: Collective, num_params: int, ratio: float) -> None:
        super().__init__(coll, num_params)
        self.k = max(1, math.ceil(ratio * num_params))

    def exchange(self, contribution: torch.Tensor, step: int) -> Exchange:
        acc = contribution.cpu() + self.residual
        _, indices = torch.topk(acc.abs(), self.k, sorted=False)
        indices = indices.sort().values  # a canonical order: the same bits on every rank
        values = acc[indices].to(torch.float16)
        sent = torch.zeros_like(acc)
        sent[indices] = values.float()
        self.residual = acc - sent
        all_indices = self.coll.allgather(indices.to(torch.int32))
        all_values = self.coll.allgather(values)
        total = torch.zeros_like(acc)
        for r in range(self.coll.size):  # fixed rank order: identical sums everywhere
            part = slice(r * self.k, (r + 1) * self.k)
            total.index_add_(0, all_indices[part].long(), all_values[part].float())
        payload = self.k * (4 + 2)
        return Exchange(total.to(contribution.device), payload, payload * (self.coll.size - 1))


class Int8Compressor(_FeedbackCompressor):
    name = "int8"

    def __init__(self, coll: Collective, num_params: int, seed: int) -> None:
        super().__init__(coll, num_params)
        self.seed = seed
        self.num_chunks = math.ceil(num_params / CHUNK)
        self.padded = self.num_chunks * CHUNK

    def exchange(self, contribution: torch.Tensor, step: int) -> Exchange:
        acc = contribution.cpu() + self.residual
        chunks = torch.zeros(self.padded)
        chunks[: self.num_params] = acc
        chunks = chunks.view(self.num_chunks, CHUNK)
        scales = chunks.abs().amax(dim=1).clamp_min(1e-30) / 127.0
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.coll.rank * 7919 + step) & 0x7FFFFFFF)
        noise = torch.rand(chunks.shape, generator=gen)
        codes = torch.floor(chunks / scales[:, None] + noise).clamp_(-127, 127).to(torch.int8)
        dequantized = (codes.float() * scales[:, None]).view(-1)[: self.num_params]
        self.residual = acc - dequantized
        n = self.num_params  # the padding of the last chunk is not sent
        all_codes = self.coll.allgather(codes.view(-1)[:n].contiguous())
        all_scales = self.coll.allgather(scales)
        total = torch.zeros(self.padded)
        for r in range(self.coll.size):
            c = torch.zeros(self.padded)
            c[:n] = all_codes[r * n : (r + 1) * n].float()
            s = all_scales[r * self.num_chunks : (r + 1) * self.num_chunks]
            total += (c.view(self.num_chunks, CHUNK) * s[:, None]).view(-1)
        payload = n + 4 * self.num_chunks
        return Exchange(total[: self.num_params].to(contribution.device), payload, payload * (self.coll.size - 1))


def make_compressor(name: str, coll: Collective, num_params: int, *, topk_ratio: float, seed: int) -> Compressor:
    if name == "none":
        return Compressor(coll, num_params)
    if name == "fp16":
        return Fp16Compressor(coll, num_params)
    if name == "topk":
        return TopKCompressor(coll, num_params, topk_ratio)
    if name == "int8":
        return Int8Compressor(coll, num_params, seed)
    raise ValueError(f"compression={name!r} is not one of {', '.join(COMPRESSIONS)}")
