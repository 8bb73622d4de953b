"""Single-process reference for the equivalence tests, written with torch and numpy only.

Nothing here comes from `blocksync`: the batch order, the loss scaling, the
optimizer, the learning-rate schedule and the model are rebuilt from the rules
below, so a bug in the library's own versions of them shows up as a parameter
difference in the tests instead of cancelling out. `cfg` is read by attribute
only (any object with TrainConfig's field names will do).

The contract reproduced
=======================

Blocks and the batch order
  - `blocks[r]` is rank r's block: features float32 [n_r, d] and labels [n_r],
    in the row order the worker holds them.
  - Every rank takes S = ceil(N / batch_size) steps per epoch (at least 1),
    N = n_0 + n_1 + ..., whatever its own block size. The run has T = S * epochs
    steps, counted t = 0 .. T-1 over the whole run.
  - In epoch e (0-based), rank r visits its block in the order
    `np.random.default_rng([seed, r, e]).permutation(n_r)` (epoch_order "global").
  - epoch_order "chunks" (the sequential-read order): with b the bytes a row takes as stored (4 per
    float32 feature value, 8 per int64 id, 8 for the label, 8 more for a weight), L = ceil(max n_r / S)
    (the largest local batch):
      chunk_rows = max(1, floor(chunk_mb * 2**20) // b);
      W = floor(shuffle_window_mb * 2**20), or when it is unset (floor(memory_budget_mb * 2**20) - L*b) // 2;
      window_chunks = max(1, W // (chunk_rows * b)).
    With rng = np.random.default_rng([seed, r, e]): the block's C = ceil(n_r / chunk_rows) chunks
    (chunk c: rows c*chunk_rows .. min((c+1)*chunk_rows, n_r) - 1) are permuted, P = rng.permutation(C);
    P is cut into windows of window_chunks consecutive entries; each window in turn lists its chunks'
    rows (in P's order, ascending within a chunk) as R and visits R[rng.permutation(len(R))]. The
    epoch's order is those windows' orders one after another.
  - Step s (0-based within the epoch) of a block of n rows takes positions
    [s*n // S, (s+1)*n // S) of that permutation: contiguous, near-equal slices
    that cover the epoch exactly once. A block with fewer rows than S gets
    some empty slices.
  - The global batch of a step is the union of every rank's slice; its size is
    the sum of the slice sizes.

Gradient sync (`sync="gradients"`): a single replica. The gradient of a step is
that of the summed loss over the global batch divided by the global batch size;
then one optimizer step. (A step whose global batch is empty has no defined
gradient: the reference refuses it.)

A custom loss (`cfg.loss`, `package.module:fn`) replaces the task's summed loss: by contract it
returns the loss summed over the rows it is given, so everything above holds with it unchanged.

Row weights: a block may be (features, labels, weights). Then each row's loss
counts times its weight, and "size" means summed weights: a step divides the
weighted loss sum over the global batch by the global batch's summed weights;
local SGD steps on its own slice's weighted mean and averages replicas weighted
by the summed weights each rank stepped on.

Local SGD (`sync="parameters"`, `sync_every=K`): one replica per rank, all
starting from the same initial weights, each with its own optimizer state.
Each rank steps on the mean loss of its own slice; a rank whose slice is empty
(or weighs nothing) takes no optimizer step, but its learning-rate schedule advances all the same.
After every step t with (t+1) % K == 0, and after the final step, every replica
is set to the mean of the replicas' parameters weighted by the number of rows
each rank stepped on since the previous average.

Loss, summed over rows: classification = cross-entropy of the outputs against
the integer class labels; regression = squared difference between the single
output and the label.

Optimizers: `sgd` = SGD with cfg.lr, cfg.momentum, and cfg.weight_decay as an L2
term added to the gradient; `adam` = Adam with cfg.lr and L2 cfg.weight_decay;
`adamw` = AdamW with cfg.lr and decoupled decay cfg.weight_decay (also when it is
0: never torch's own 0.01 default). Every other hyper-parameter is torch's default.

Learning rate at step t: cfg.lr * f(t) with W = cfg.warmup_steps:
  f(t) = (t + 1) / W while t < W (linear warm-up); afterwards, with
  p = min(1, (t - W) / max(1, T - W)):
  constant: 1;  cosine: (1 + cos(pi p)) / 2;  step: 0.1 ** floor(3 p)
  (x0.1 from 1/3 and again from 2/3 of the post-warm-up steps).

Model (initial weights): `torch.manual_seed(seed)`, then the layers are created in
this order, each with torch's default initialization:
  logreg: one Linear(d, outputs);
  mlp: for each hidden width h: Linear(width, h), ReLU, and Dropout(p) if p > 0;
  then Linear(width, outputs); all in one Sequential.
Dropout masks: each rank draws from its own copy of torch's global generator as
it stands right after the model is built, one forward pass per non-empty slice.

Typed inputs: a block's features may be a dict {input name: array} (numeric float32 [n, w],
categorical int64 [n], tokens int64 [n, L]), with `cfg_inputs` given to `reference_train` as
[(name, kind, width, cardinality, pad)] in input order. Models over them, in creation order:
  embedding_mlp: for each categorical input in order, Embedding(cardinality, e) with
    e = options.embedding_dim or min(50, (cardinality + 1) // 2); then the mlp above over the
    numeric inputs and the embeddings concatenated in input order.
  transformer (one tokens input of length L, vocabulary V): Embedding(V, d_model), Embedding(L,
    d_model) for positions, TransformerEncoder(TransformerEncoderLayer(d_model, heads, ff, dropout,
    batch_first=True), layers), Linear(d_model, outputs). Forward: token + position embeddings,
    the encoder with the padding positions masked (when `pad` is set), the mean over non-padding
    positions, the head. Options default to d_model 32, heads 4, layers 2, dim_feedforward 64.

Not covered, and refused: other models (cnn, import paths), gradient compression,
bf16 mixed precision.
"""

from __future__ import annotations

import copy
import importlib
import math
from typing import Any

import numpy as np
import torch
from torch import nn

Block = tuple[np.ndarray, ...]  # (features, labels) or (features, labels, weights)


# --- the batch order ------------------------------------------------------------

def steps_in_epoch(total_rows: int, batch_size: int) -> int:
    return max(1, (total_rows + batch_size - 1) // batch_size)


def visit_order(block_rows: int, seed: int, rank: int, epoch: int, layout: tuple[int, int] | None = None) -> np.ndarray:
    """The epoch's order: the global permutation, or with `layout` = (chunk_rows, window_chunks) the chunks one."""
    rng = np.random.default_rng([seed, rank, epoch])
    if layout is None:
        return rng.permutation(block_rows)
    chunk_rows, window_chunks = layout
    chunks = rng.permutation((block_rows + chunk_rows - 1) // chunk_rows)
    order: list[int] = []
    for lo in range(0, len(chunks), window_chunks):
        rows = [row for c in chunks[lo:lo + window_chunks]
                for row in range(c * chunk_rows, min((c + 1) * chunk_rows, block_rows))]
        order.extend(rows[i] for i in rng.permutation(len(rows)))
    return np.array(order, dtype=np.int64)


def row_bytes(block: Block) -> int:
    """Bytes a row of `block` takes as stored: its feature values (4 each, or 8 for an id), 8 for the label
    and 8 for a weight."""
    x = block[0]
    if isinstance(x, dict):
        width = sum((4 if np.asarray(v).dtype == np.float32 else 8) * int(np.prod(np.asarray(v).shape[1:]))
                    for v in x.values())
    else:
        width = 4 * np.asarray(x).shape[1]
    return width + 8 + (8 if len(block) > 2 else 0)


def chunk_layout(blocks: list[Block], cfg: Any, steps: int) -> tuple[int, int] | None:
    """(chunk_rows, window_chunks) for epoch_order "chunks", from the rule above; None for "global"."""
    if getattr(cfg, "epoch_order", "global") == "global":
        return None
    b = row_bytes(blocks[0])
    batch = -(-max(len(bl[1]) for bl in blocks) // steps)
    chunk_rows = max(1, math.floor(cfg.chunk_mb * 2**20) // b)
    if cfg.shuffle_window_mb is not None:
        window = math.floor(cfg.shuffle_window_mb * 2**20)
    else:
        window = (math.floor(cfg.memory_budget_mb * 2**20) - batch * b) // 2
    return chunk_rows, max(1, window // (chunk_rows * b))


def step_rows(order: np.ndarray, step: int, steps: int) -> np.ndarray:
    """The rows (block indices) a rank uses in `step` of an epoch of `steps` steps."""
    n = len(order)
    return order[step * n // steps : (step + 1) * n // steps]


def epoch_batches(blocks: list[Block], seed: int, epoch: int, steps: int,
                  layout: tuple[int, int] | None = None) -> list[list[np.ndarray]]:
    """[step][rank] -> that rank's row indices."""
    orders = [visit_order(len(b[1]), seed, rank, epoch, layout) for rank, b in enumerate(blocks)]
    return [[step_rows(order, s, steps) for order in orders] for s in range(steps)]


# --- model, loss, optimizer, schedule -------------------------------------------

class _Embedded(nn.Module):
    def __init__(self, spec: Any, inputs: list[tuple], num_outputs: int) -> None:
        super().__init__()
        self.inputs = inputs
        dim = spec.options.get("embedding_dim")
        self.tables = nn.ModuleList([nn.Embedding(card, dim or min(50, (card + 1) // 2))
                                     for _, kind, _, card, _ in inputs if kind == "categorical"])
        width = sum(w for _, kind, w, _, _ in inputs if kind == "numeric") + sum(t.embedding_dim for t in self.tables)
        self.net = reference_model(type(spec)(name="mlp", hidden=spec.hidden, dropout=spec.dropout), width,
                                   num_outputs)

    def forward(self, x: dict) -> torch.Tensor:
        tables = iter(self.tables)
        return self.net(torch.cat([next(tables)(x[name]) if kind == "categorical" else x[name]
                                   for name, kind, _, _, _ in self.inputs], dim=1))


class _Encoder(nn.Module):
    def __init__(self, spec: Any, inputs: list[tuple], num_outputs: int) -> None:
        super().__init__()
        ((self.name, _, length, vocab, self.pad),) = inputs
        o = {"d_model": 32, "heads": 4, "layers": 2, "dim_feedforward": 64, **spec.options}
        self.tok, self.pos = nn.Embedding(vocab, o["d_model"]), nn.Embedding(length, o["d_model"])
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(
            o["d_model"], o["heads"], o["dim_feedforward"], spec.dropout, batch_first=True), o["layers"],
            enable_nested_tensor=False)
        self.out = nn.Linear(o["d_model"], num_outputs)

    def forward(self, x: dict) -> torch.Tensor:
        ids = x[self.name]
        h = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        mask = None if self.pad is None else ids == self.pad
        h = self.enc(h, src_key_padding_mask=mask)
        keep = torch.ones_like(ids, dtype=h.dtype) if mask is None else (~mask).to(h.dtype)
        return self.out((h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0))


def reference_model(spec: Any, num_features: int, num_outputs: int, inputs: list[tuple] | None = None) -> nn.Module:
    if spec.name == "embedding_mlp":
        return _Embedded(spec, inputs or [], num_outputs)
    if spec.name == "transformer":
        return _Encoder(spec, inputs or [], num_outputs)
    if spec.name == "logreg":
        return nn.Linear(num_features, num_outputs)
    if spec.name == "mlp":
        layers: list[nn.Module] = []
        width = num_features
        for h in spec.hidden:
            layers.append(nn.Linear(width, int(h)))
            layers.append(nn.ReLU())
            if spec.dropout > 0:
                layers.append(nn.Dropout(spec.dropout))
            width = int(h)
        layers.append(nn.Linear(width, num_outputs))
        return nn.Sequential(*layers)
    raise ValueError(f"the reference builds logreg, mlp, embedding_mlp and transformer only, not {spec.name!r}")


def summed_loss(outputs: torch.Tensor, labels: torch.Tensor, task: str, loss: str | None = None,
                smoothing: float = 0.0) -> torch.Tensor:
    """The task's summed loss, or the user's `package.module:fn` (it sums over rows by contract).

    `smoothing` is written out, not torch's label_smoothing argument: the target puts 1 - eps + eps/C
    on the label and eps/C on every other class, and the loss is the cross-entropy against it."""
    if loss:
        module_name, _, name = loss.partition(":")
        fn = getattr(importlib.import_module(module_name), name)
        return fn(outputs, labels.long() if task == "classification" else labels.to(outputs.dtype))
    if task == "classification":
        log_p = torch.log_softmax(outputs, dim=1)
        target = torch.full_like(log_p, smoothing / outputs.shape[1])
        target[torch.arange(len(labels)), labels.long()] += 1.0 - smoothing
        return -(target * log_p).sum()
    if task == "regression":
        return ((outputs[:, 0] - labels.to(outputs.dtype)) ** 2).sum()
    raise ValueError(f"unknown task {task!r}")


def reference_optimizer(params: list[nn.Parameter], cfg: Any) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def learning_rate(t: int, total_steps: int, cfg: Any) -> float:
    warmup = cfg.warmup_steps
    if t < warmup:
        return cfg.lr * ((t + 1) / warmup)
    p = min(1.0, (t - warmup) / max(1, total_steps - warmup))
    if cfg.schedule == "constant":
        return cfg.lr * 1.0
    if cfg.schedule == "cosine":
        return cfg.lr * (0.5 * (1.0 + math.cos(math.pi * p)))
    if cfg.schedule == "step":
        return cfg.lr * (0.1 ** math.floor(3 * p))
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# --- training -------------------------------------------------------------------

class _Rows:
    """A dict of per-input tensors that row-indexes like one tensor (shape[1]: unused by typed models)."""

    def __init__(self, parts: dict) -> None:
        self.parts = parts
        self.shape = (len(next(iter(parts.values()))), 0)

    def __getitem__(self, idx: torch.Tensor) -> _Rows:
        return _Rows({k: v[idx] for k, v in self.parts.items()})


class _Run:
    """What both sync modes share: the tensors, the step count and each rank's generator state."""

    def __init__(self, blocks: list[Block], cfg: Any, num_outputs: int, inputs: list[tuple] | None) -> None:
        if cfg.compression != "none" or cfg.mixed_precision != "none":
            raise ValueError("the reference covers compression=none and mixed_precision=none only")
        self.cfg = cfg
        self.x = [_Rows({k: torch.from_numpy(np.asarray(v)) for k, v in b[0].items()}) if isinstance(b[0], dict)
                  else torch.from_numpy(np.ascontiguousarray(b[0], dtype=np.float32)) for b in blocks]
        self.y = [torch.from_numpy(np.asarray(b[1])) for b in blocks]
        # No weights: every row weighs 1, and sums of weights are row counts.
        self.w = [torch.from_numpy(np.asarray(b[2], dtype=np.float64)) if len(b) > 2 else None for b in blocks]
        self.blocks = blocks
        self.steps = steps_in_epoch(sum(len(b[1]) for b in blocks), cfg.batch_size)
        self.total_steps = self.steps * cfg.epochs
        torch.manual_seed(cfg.seed)
        self.model = reference_model(cfg.model, self.x[0].shape[1], num_outputs, inputs)
        self.model.train()
        self.streams = [torch.get_rng_state() for _ in blocks]

    def schedule(self):
        """(t, [rank] -> row indices) for every step of the run."""
        t = 0
        layout = chunk_layout(self.blocks, self.cfg, self.steps)
        for epoch in range(self.cfg.epochs):
            for rows in epoch_batches(self.blocks, self.cfg.seed, epoch, self.steps, layout):
                yield t, rows
                t += 1

    def rank_loss(self, model: nn.Module, rank: int, rows: np.ndarray) -> torch.Tensor:
        """Summed (weighted) loss of `rank`'s rows, drawing any dropout mask from that rank's own generator."""
        idx = torch.from_numpy(rows)
        torch.set_rng_state(self.streams[rank])
        x = self.x[rank][idx]
        out = model(x.parts if isinstance(x, _Rows) else x)
        self.streams[rank] = torch.get_rng_state()
        if self.w[rank] is None:
            return summed_loss(out, self.y[rank][idx], self.cfg.task, self.cfg.loss, self.cfg.label_smoothing)
        weights = self.w[rank][idx]
        return sum(weights[i].float() * summed_loss(out[i:i + 1], self.y[rank][idx][i:i + 1], self.cfg.task,
                                                    smoothing=self.cfg.label_smoothing)
                   for i in range(len(rows)))

    def size(self, rank: int, rows: np.ndarray) -> float:
        """The rows' count, or their summed weights."""
        return float(len(rows)) if self.w[rank] is None else float(self.w[rank][torch.from_numpy(rows)].sum())


def reference_train(blocks: list[Block], cfg: Any, num_outputs: int, inputs: list[tuple] | None = None) -> nn.Module:
    """The model the engine should end with, for `cfg.sync` "gradients" or "parameters"."""
    with torch.random.fork_rng(devices=[]):  # leaves the caller's generator as it was
        run = _Run(blocks, cfg, num_outputs, inputs)
        if cfg.sync == "gradients":
            return _gradient_sync(run)
        if cfg.sync == "parameters":
            return _local_sgd(run)
        raise ValueError(f"unknown sync {cfg.sync!r}")


def _gradient_sync(run: _Run) -> nn.Module:
    model = run.model
    optimizer = reference_optimizer(list(model.parameters()), run.cfg)
    for t, rows in run.schedule():
        global_batch = sum(run.size(rank, r) for rank, r in enumerate(rows))
        if global_batch == 0:
            raise ValueError(f"step {t} has an empty (or weightless) global batch: no defined gradient")
        set_lr(optimizer, learning_rate(t, run.total_steps, run.cfg))
        optimizer.zero_grad()
        total = sum(run.rank_loss(model, rank, r) for rank, r in enumerate(rows) if len(r))
        (total / global_batch).backward()
        optimizer.step()
    return model


def _local_sgd(run: _Run) -> nn.Module:
    replicas = [copy.deepcopy(run.model) for _ in run.blocks]
    optimizers = [reference_optimizer(list(m.parameters()), run.cfg) for m in replicas]
    since_average = [0.0] * len(replicas)
    for t, rows in run.schedule():
        lr = learning_rate(t, run.total_steps, run.cfg)
        for rank, (model, optimizer, r) in enumerate(zip(replicas, optimizers, rows, strict=True)):
            if not len(r) or run.size(rank, r) == 0:
                continue
            set_lr(optimizer, lr)
            optimizer.zero_grad()
            (run.rank_loss(model, rank, r) / run.size(rank, r)).backward()
            optimizer.step()
            since_average[rank] += run.size(rank, r)
        if (t + 1) % run.cfg.sync_every == 0 or t + 1 == run.total_steps:
            _average(replicas, since_average, t)
            since_average = [0.0] * len(replicas)
    return replicas[0]


@torch.no_grad()
def _average(replicas: list[nn.Module], weights: list[float], t: int) -> None:
    total = sum(weights)
    if total == 0:
        raise ValueError(f"no rank used any rows before the average after step {t}")
    for params in zip(*(m.parameters() for m in replicas), strict=True):
        mean = sum(w * p.double() for w, p in zip(weights, params, strict=True)) / total
        for p in params:
            p.copy_(mean)


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    """Largest absolute difference between corresponding parameters (same architecture required)."""
    pa, pb = list(a.parameters()), list(b.parameters())
    assert [p.shape for p in pa] == [p.shape for p in pb], "the two models differ in architecture"
    return max(float((p - q).detach().abs().max()) for p, q in zip(pa, pb, strict=True))
