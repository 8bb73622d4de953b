"""Gradient compression for the per-step exchange: none, fp16, top-k, int8 (stochastic), PowerSGD.

Every rank passes its *contribution* (its summed local gradient divided by the
global batch size, which every rank knows before the step) and receives the
global mean gradient, identical on every rank.

Each mode, what it sends and what it keeps: `make_compressor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from blocksync.engine.comm.collectives import Collective
from blocksync.engine.config import COMPRESSIONS

CHUNK = 4096


def wire_bytes(kind: str, payload_bytes: float, workers: int) -> float:
    """Bytes one rank sends for a `payload_bytes` contribution: ring all-reduce or all-gather."""
    if kind == "allreduce":
        return 2.0 * (workers - 1) / workers * payload_bytes
    return float((workers - 1) * payload_bytes)


@dataclass
class Exchange:
    mean_gradient: torch.Tensor
    payload_bytes: int
    wire_bytes: float


class Compressor:
    name = "none"
    kind = "allreduce"  # how the payload travels: "allreduce" or "allgather" (see `wire_bytes`)

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
    kind = "allgather"

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
        return Exchange(total.to(contribution.device), payload, wire_bytes(self.kind, payload, self.coll.size))


class Int8Compressor(_FeedbackCompressor):
    name = "int8"
    kind = "allgather"

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
        wire = wire_bytes(self.kind, payload, self.coll.size)
        return Exchange(total[: self.num_params].to(contribution.device), payload, wire)


class PowerSGDCompressor(_FeedbackCompressor):
    name = "powersgd"

    def __init__(self, coll: Collective, shapes: list[torch.Size], rank: int, seed: int) -> None:
        sizes = [math.prod(s) for s in shapes]
        super().__init__(coll, sum(sizes))
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.matrices: list[tuple[int, int, int]] = []  # (offset, n, m) of each compressed matrix
        self.dense: list[slice] = []  # everything sent as is
        for offset, size, shape in zip(offsets, sizes, shapes, strict=True):
            n, m = (shape[0], size // shape[0]) if len(shape) >= 2 else (1, size)
            if len(shape) >= 2 and rank * (n + m) < n * m:
                self.matrices.append((offset, n, m))
            else:
                self.dense.append(slice(offset, offset + size))
        gen = torch.Generator().manual_seed(seed)
        self.qs = [torch.randn(m, rank, generator=gen) for _, _, m in self.matrices]
        self.low_rank = rank

    def exchange(self, contribution: torch.Tensor, step: int) -> Exchange:
        acc = contribution.cpu() + self.residual
        mats = [acc[o : o + n * m].view(n, m) for o, n, m in self.matrices]
        dense = [acc[sl] for sl in self.dense]
        first = torch.cat([*[(mat @ q).reshape(-1) for mat, q in zip(mats, self.qs, strict=True)], *dense])
        first = self.coll.allreduce_sum(first)
        ps, rest = self._split(first, [n * self.low_rank for _, n, _ in self.matrices])
        ps = [torch.linalg.qr(p.view(-1, self.low_rank)).Q for p in ps]  # identical input: identical basis
        own_qs = [mat.T @ p for mat, p in zip(mats, ps, strict=True)]
        second = self.coll.allreduce_sum(torch.cat([q.reshape(-1) for q in own_qs])) if own_qs else torch.zeros(0)
        q_parts, _ = self._split(second, [m * self.low_rank for _, _, m in self.matrices])
        self.qs = [q.view(-1, self.low_rank) for q in q_parts]
        total = torch.empty_like(acc)
        sent = acc.clone()  # becomes what this rank sent; dense parts are sent exactly
        for (o, n, m), p, q, own in zip(self.matrices, ps, self.qs, own_qs, strict=True):
            total[o : o + n * m] = (p @ q.T).reshape(-1)
            sent[o : o + n * m] = (p @ own.T).reshape(-1)
        for sl, part in zip(self.dense, self._split(rest, [sl.stop - sl.start for sl in self.dense])[0], strict=True):
            total[sl] = part
        self.residual = acc - sent
        payload = (first.numel() + second.numel()) * 4
        return Exchange(total.to(contribution.device), payload, self.coll.bytes_per_allreduce(payload))

    @staticmethod
    def _split(flat: torch.Tensor, lengths: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """`flat` cut into pieces of `lengths`, and what is left after them."""
        pieces = list(torch.split(flat[: sum(lengths)], lengths)) if lengths else []
        return pieces, flat[sum(lengths) :]

    def state(self) -> dict[str, torch.Tensor]:
        return {**super().state(), **{f"q.{i}": q.clone() for i, q in enumerate(self.qs)}}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state(state)
        self.qs = [state[f"q.{i}"].clone() for i in range(len(self.qs))]


def make_compressor(name: str, coll: Collective, shapes: list[torch.Size], *, topk_ratio: float,
                    powersgd_rank: int, seed: int) -> Compressor:
    """The compressor `name` for parameters of `shapes` (in `parameters()` order).

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
    - `powersgd`: rank-r PowerSGD with error feedback (Vogels et al., 2019). Each
      weight matrix M (n x m, after adding its residual) is sent as two all-reduced
      factors: P = M Q (n x r), orthogonalized identically on every rank, then
      Q = M^T P (m x r); the step uses P Q^T. Q is kept from step to step (warm
      start) and starts from a seeded normal draw shared by every rank. Biases,
      other vectors and matrices too small to gain (r (n + m) >= n m) go
      uncompressed in the first all-reduce. Each rank keeps M - P Q_rank^T as its
      residual, where Q_rank is its own contribution to Q, so the residuals and
      what was sent add up to the uncompressed sum exactly.

    `payload_bytes` is what one rank contributes per step (the message size S);
    `wire_bytes` estimates what it sends: 2(N-1)/N x S for a ring all-reduce,
    (N-1) x S for an all-gather. All-gather schemes (topk, int8) therefore send
    more per rank as workers are added; all-reduce schemes (none, fp16, powersgd)
    send less than 2 S at any N.
    """
    num_params = sum(math.prod(s) for s in shapes)
    if name == "powersgd":
        return PowerSGDCompressor(coll, shapes, powersgd_rank, seed)
    if name == "none":
        return Compressor(coll, num_params)
    if name == "fp16":
        return Fp16Compressor(coll, num_params)
    if name == "topk":
        return TopKCompressor(coll, num_params, topk_ratio)
    if name == "int8":
        return Int8Compressor(coll, num_params, seed)
    raise ValueError(f"compression={name!r} is not one of {', '.join(COMPRESSIONS)}")
