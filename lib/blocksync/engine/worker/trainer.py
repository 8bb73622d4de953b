"""One rank's block-synchronous training loop (worker side).

`Trainer` holds the replica (model, optimizer, schedule, compressor) and the rank's block; its docstring
says what each piece of the loop does. The protocol every rank follows around it, start-up to results,
is `engine.worker.worker.make_worker`'s docstring.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from blocksync.engine import checkpoint
from blocksync.engine.comm.buckets import GradientBuckets
from blocksync.engine.comm.collectives import Collective, to_collective
from blocksync.engine.comm.compression import make_compressor
from blocksync.engine.comm.sharding import ShardedOptimizer, all_finite
from blocksync.engine.inputs import LEAST_TOTAL_WEIGHT, total_weight_problem
from blocksync.engine.losses import import_loss, loss_sum
from blocksync.engine.models import build_model
from blocksync.engine.optim import build_optimizer, build_schedule
from blocksync.engine.progress import Heartbeat
from blocksync.engine.worker.anon_memory import rss_anon_mb
from blocksync.engine.worker.block_data import batch_slices, split_targets
from blocksync.engine.worker.epoch_order import EpochOrder, epoch_order
from blocksync.engine.worker.shard_resume import load_shard, resharded_rank_state
from blocksync.engine.worker.state_fits import check_state_fits
from blocksync.engine.worker.window_reader import Feed, open_feed

if TYPE_CHECKING:
    from blocksync.engine.plan import WorkerPlan
    from blocksync.engine.worker.block_store import Block

log = logging.getLogger(__name__)


class ReplicaDivergence(RuntimeError):
    """Replicas no longer hold identical parameters after a sync."""


class TrainingDiverged(ValueError):
    """The loss or the synchronized gradient became NaN or infinite: a setting (usually lr) to change."""


def params_digest(model: torch.nn.Module) -> str:
    """SHA-1 (hex) of the parameter bytes."""
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_replicas(coll: Collective, model: torch.nn.Module, step: int) -> None:
    """Compare every rank's full SHA-1 parameter digest with rank 0's; raise naming the ranks that differ."""
    digests = coll.gather_digests(params_digest(model))
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    if bad:
        raise ReplicaDivergence(
            f"replica(s) {bad} diverged from rank 0 after step {step} (SHA-1 parameter digests differ)"
        )


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def set_params(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy `flat` into the parameters in place (vector_to_parameters would rebind them to views of `flat`,
    and a sharded run's parameters must stay views of its flat buffer)."""
    flat = flat.to(next(model.parameters()).device)
    at = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()


class Trainer:
    """`Trainer` holds the replica (model, optimizer, schedule, compressor) and the
    rank's block, and runs the loop one named piece at a time:

    - `step()`: take this step's slice of the epoch's seeded permutation, compute
      the *summed* loss and its gradients (`compute`), exchange them (`sync`),
      take the optimizer step, and record the step's phase timings.
    - `sync()`: `gradients` mode divides the local gradient sum by the step's
      global batch size (known to every rank before the step: the driver fixed the
      steps per epoch and every rank knows every block size) and exchanges the
      flat buffer, so every rank receives the global batch's mean gradient and
      takes the identical step. With `overlap` the same happens per bucket, started
      during backward (`comm.buckets.GradientBuckets`); `sync` waits for them.
      `parameters` mode steps on the local mean gradient and every `sync_every`
      steps sets the sample-weighted mean of the replicas' parameters (local SGD).
    - `end_epoch()`: one small all-reduce makes the epoch's loss and accuracy
      global; the result goes into the history. With validation rows, a second one
      sums every rank's loss and correct count on its held-out rows (eval mode, no
      gradients) into `val_loss` and `val_accuracy`. Early stopping compares that
      all-reduced loss, identical on every rank, so every rank stops after the same
      epoch; the weights of the best epoch are kept (and travel in checkpoints) and
      become the result.
    - `snapshot()`: every rank writes its part of a checkpoint at the same step.

    Divergence: the exchanged gradient (or the averaged parameters, or the epoch's
    global loss) is identical on every rank, so every rank sees the same NaN or
    inf at the same step and raises the same `TrainingDiverged`: nobody is left
    waiting in a collective.
    """
    def __init__(self, plan: WorkerPlan, coll: Collective, block: Block, block_rows: list[int],
                 device: torch.device, beat: Heartbeat,
                 validation: tuple[torch.Tensor, ...] | None = None) -> None:
        cfg = self.cfg = plan.config
        self.plan, self.coll, self.block, self.device, self.beat = plan, coll, block, device, beat
        self.validation = validation
        self.best_params: torch.Tensor | None = None  # early stopping: the lowest val_loss epoch's weights
        self.rank = coll.rank
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, plan.num_features, plan.num_outputs, plan.inputs).to(device)
        set_params(self.model, coll.broadcast(to_collective(coll, flat_params(self.model).contiguous()), root=0))
        self.model.train()
        self.custom_loss = import_loss(cfg.loss) if cfg.loss else None  # probed on the driver (losses.check_loss)
        # shard=optimizer: this rank's optimizer steps only its 1/N slice of the flat parameters (`sharding`).
        # An optimizer holds no state before its first step (building the first one imports ~70 MiB of torch).
        self.sharded = ShardedOptimizer(self.model, cfg, coll) if cfg.shard == "optimizer" else None
        self.optimizer = self.sharded.optimizer if self.sharded else build_optimizer(self.model, cfg)
        self.schedule = build_schedule(self.optimizer, plan.total_steps, cfg)
        params = list(self.model.parameters())
        self.num_params = sum(p.numel() for p in params)
        # RssAnon with the model and an empty optimizer built: what `training_state_bytes` adds to.
        self.anon_at_model_mb = rss_anon_mb()
        if cfg.backend != "spark":  # (its collectives cost a second each; it trains tiny models only)
            # Every model is built: a limit that cannot hold the gradients and optimizer state is named now.
            check_state_fits(coll, cfg, self.num_params, largest=max(p.numel() for p in params))
        # Gradients exist from the start, so an empty local batch still all-reduces zeros;
        # zero_grad(set_to_none=False) and backward() keep writing into these same tensors.
        # Sharded, they are views of one flat padded buffer, which the reduce-scatter then sends as it is.
        self.grads = self.sharded.gradient_views(params) if self.sharded else [torch.zeros_like(p) for p in params]
        for p, g in zip(params, self.grads, strict=True):
            p.grad = g
        self.global_batch = np.sum(
            [[hi - lo for lo, hi in batch_slices(n, plan.steps_per_epoch)] for n in block_rows], axis=0)
        self.compressor = make_compressor(cfg.compression, coll, [p.shape for p in self.model.parameters()],
                                          topk_ratio=cfg.topk_ratio, powersgd_rank=cfg.powersgd_rank, seed=cfg.seed)
        # train.overlap: bucket all-reduces started by autograd hooks during backward (see `sync`).
        self.buckets = GradientBuckets(coll, params, self.grads, bucket_mb=cfg.bucket_mb,
                                       fp16=cfg.compression == "fp16") if cfg.overlaps else None
        slow = cfg.faults.slow_rank == self.rank
        self.slow_seconds = cfg.faults.slow_ms / 1000.0 if slow else 0.0
        self.slow_factor = cfg.faults.slow_factor if slow else 1.0
        self.history: list[dict[str, float]] = []
        self.step_count = 0
        self.first_step = 0
        self.first_step_done_at: float | None = None  # time.time() after this attempt's first step
        self.epoch_stats = torch.zeros(3, dtype=torch.float64)  # samples, summed loss, correct (this epoch)
        # Bytes this rank contributed (payload) and sent (wire) on the way to the current step; they
        # travel in checkpoints, so a resumed run reports the whole run's traffic.
        self.traffic = torch.zeros(2, dtype=torch.float64)
        self.samples_since_sync = 0.0
        self.check_pending = False  # a replica check is due at the next step where replicas are in sync
        # Per step: start (s since this attempt's loop began), data, compute, sync, optimizer seconds.
        self.timings = np.zeros((plan.total_steps, 5), dtype=np.float64)
        self.read_seconds = 0.0  # epoch_order=chunks on disk: the window reader's time, overlapped with steps
        self.started = time.perf_counter()

    def resume(self, path: str) -> None:
        snap = checkpoint.read(path)
        checkpoint.check_shard_mode(snap, self.cfg.shard, path)
        zero = snap.zero
        resharded = zero is not None and zero["num_shards"] != self.coll.size
        snap.rank_state = resharded_rank_state(path, zero, self.rank) if zero is not None and resharded else (
            checkpoint.read_part(path, f"rank-{self.rank:05d}"))
        self.model.load_state_dict(snap.model)  # in place: a sharded run's slice is a view of these weights
        if self.sharded is not None and snap.zero is not None:
            load_shard(self.sharded, path, snap)
        else:
            self.optimizer.load_state_dict(snap.optimizer)
        self.schedule.load_state_dict(snap.scheduler)
        torch.set_rng_state(snap.rng)
        own = {k: v for k, v in snap.rank_state.items() if k not in ("epoch_stats", "traffic", "best_params")}
        self.compressor.load_state(own)
        self.epoch_stats = snap.rank_state["epoch_stats"].clone()
        if "traffic" in snap.rank_state:
            self.traffic = snap.rank_state["traffic"].clone()
        if "best_params" in snap.rank_state:
            self.best_params = snap.rank_state["best_params"].clone().to(self.device)
        self.history, self.step_count = snap.history, snap.step
        self.first_step = snap.step
        log.info("rank %d: resumed from %s at step %d%s", self.rank, path, snap.step,
                 f" (optimizer state resharded from {zero['num_shards']} shards)" if zero and resharded else "")

    def run(self, feed: Feed | None = None) -> float:
        """Train the remaining steps; returns this attempt's training seconds. `feed`: the run's feed from
        step 0 (`open_run_feed`), opened by the worker before the rendezvous; else opened here."""
        per_epoch, rows = self.plan.steps_per_epoch, self.block.rows
        self.started = time.perf_counter()
        first_epoch = self.step_count // per_epoch
        slices = batch_slices(rows, per_epoch)
        if feed is not None and self.step_count:  # resumed after all: that feed starts at step 0
            feed.close()
            feed = None
        if first_epoch >= self.cfg.epochs:  # resumed from the last step's checkpoint: nothing left to read
            return self.finish()
        if feed is None:
            feed = open_run_feed(self.plan, self.block, self.rank, self.device, self.step_count)
        try:
            for epoch in range(first_epoch, self.cfg.epochs):
                if epoch > first_epoch:
                    feed.next_epoch()
                if self.plan.weighted:
                    order = epoch_order(rows, self.cfg.seed, self.rank, epoch, self.plan.chunks)
                    self.global_batch = self.step_weights(order.rows, slices)
                for s_in_epoch in range(self.step_count - epoch * per_epoch, per_epoch):
                    self.step(epoch, s_in_epoch, feed, slices[s_in_epoch])
                    if self.first_step_done_at is None:
                        self.first_step_done_at = time.time()
                    if s_in_epoch < per_epoch - 1:
                        self.snapshot()
                self.end_epoch(epoch)
                stop = self.stop_early()  # before the snapshot: a resumed run needs this epoch's best weights
                self.snapshot()
                if stop:
                    break
        finally:
            feed.close()
            self.read_seconds += feed.read_seconds
        return self.finish()

    def finish(self) -> float:
        """After the last step: the best weights (early stopping) and a last replica check; this attempt's
        training seconds."""
        seconds = time.perf_counter() - self.started
        if self.best_params is not None:
            set_params(self.model, self.best_params)
        self.beat.at(self.step_count, "sync")
        check_replicas(self.coll, self.model, self.step_count)
        return seconds

    def step_weights(self, order: np.ndarray, slices: list[tuple[int, int]]) -> np.ndarray:
        """Collective, once an epoch: each step's summed row weights over every rank's slice, the
        denominator of that step's weighted mean, known to every rank before the step."""
        weights = self.block.weights().double()[torch.from_numpy(order)]
        local = torch.tensor([float(weights[lo:hi].sum()) for lo, hi in slices], dtype=torch.float64)
        # float64 all the way: every rank divides by the same bits the reference sums to.
        return self.coll.allreduce_sum(local).numpy().astype(np.float64)

    def step(self, epoch: int, s_in_epoch: int, feed: Feed, bounds: tuple[int, int]) -> None:
        step, (lo, hi) = self.step_count, bounds
        self.beat.at(step, "compute")
        _inject_fault(self.plan, self.rank, step, self.beat)
        t_data = time.perf_counter()
        xb, ib, yb = feed.take(lo, hi)  # with a window reader: includes any wait for the next window
        t_compute = time.perf_counter()
        if self.buckets is not None:
            self.buckets.arm(float(self.global_batch[s_in_epoch]))
        count = self.compute(xb, ib, yb)
        straggle(time.perf_counter() - t_compute, self.slow_factor, self.slow_seconds)
        t_sync = time.perf_counter()
        self.beat.at(step, "sync")
        self.sync(s_in_epoch, count)
        t_opt = time.perf_counter()
        gather = 0.0  # shard=optimizer: the all-gather after the step is communication, timed as sync
        if self.sharded is not None:
            gather = self.sharded_step()
        elif self.cfg.sync == "gradients" or count:
            self.optimizer.step()
        self.schedule.step()
        self.step_count += 1
        t_end = time.perf_counter()
        averaging = self.average_if_due()
        self.timings[step] = (t_data - self.started, t_compute - t_data, t_sync - t_compute + gather,
                              t_opt - t_sync + averaging, t_end - t_opt - gather)
        if self.cfg.check_every and self.step_count % self.cfg.check_every == 0:
            self.check_pending = True
        if self.check_pending and self.in_sync():
            check_replicas(self.coll, self.model, self.step_count)
            self.check_pending = False
        if self.rank == 0:
            loss = float(self.epoch_stats[1]) / max(float(self.epoch_stats[0]), 1.0)
            self.beat.progress(epoch=epoch + 1, step=self.step_count, loss=loss, samples_per_sec=self.rate())

    def sharded_step(self) -> float:
        """shard=optimizer: step this rank's slice, gather the slices into the model's flat buffer in place.
        Every rank checks the same gathered parameters, so a NaN gradient in any slice stops every rank at
        this step. Returns the gather's seconds."""
        assert self.sharded is not None
        seconds = self.sharded.step()
        if not all_finite(self.sharded.flat_param):
            raise self.diverged("the reduce-scattered gradient (or the parameters stepped with it)")
        return seconds

    def forward(self, xb: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The network on a batch: the feature matrix, or with typed inputs the dict of them (`inputs`)."""
        inputs = self.plan.inputs
        return self.model(xb if inputs is None else inputs.model_input(xb, ids))

    def compute(self, xb: torch.Tensor, ids: torch.Tensor, targets: torch.Tensor) -> float:
        """Summed (weighted) loss and its gradients (into self.grads) over the local batch; returns the
        row count, or with row weights their sum."""
        self.model.zero_grad(set_to_none=False)  # the model's gradients (a sharded optimizer holds a slice's)
        if not xb.shape[0]:
            return 0.0
        yb, wb = split_targets(targets)
        count = float(xb.shape[0]) if wb is None else float(wb.sum())
        bf16 = self.cfg.mixed_precision == "bf16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            out = self.forward(xb, ids)
            loss = loss_sum(out.float(), yb, self.cfg.task, wb, self.custom_loss, self.cfg.label_smoothing)
        loss.backward()
        self.epoch_stats[0] += count
        self.epoch_stats[1] += float(loss.detach())
        if self.cfg.task == "classification":
            right = (out.detach().argmax(1) == yb.long()).double()
            self.epoch_stats[2] += float(right.sum() if wb is None else (right * wb).sum())
        return count

    def sync(self, s_in_epoch: int, count: float) -> None:
        if self.cfg.sync == "parameters":
            if count:
                for g in self.grads:
                    g.div_(count)
            self.samples_since_sync += count
            return
        # A step where no rank has rows (tiny blocks, small batches), or only rows of weight 0, has zero
        # gradients everywhere: it exchanges zeros, not 0/0.
        if self.buckets is not None:  # the buckets were divided and started during backward
            done = self.buckets.finish()
            # Sharded, the mean gradient is now in the flat buffer, and the slice's optimizer reads its views:
            # the all-reduce-and-keep-a-slice fallback, per bucket; the gather after the step adds its bytes.
            extra = self.sharded.gather_bytes() if self.sharded is not None else (0.0, 0.0)
            self.traffic += torch.tensor([done.payload_bytes + extra[0], done.wire_bytes + extra[1]],
                                         dtype=torch.float64)
            if not done.finite:
                raise self.diverged("the all-reduced gradient")
            return
        total = float(self.global_batch[s_in_epoch])
        if self.sharded is not None:  # only this rank's slice of the mean gradient comes back
            payload, wire = self.sharded.exchange(total if total > 0 else 1.0)
            self.traffic += torch.tensor([payload, wire], dtype=torch.float64)
            return
        contribution = torch.cat([g.reshape(-1) for g in self.grads]) / (total if total > 0 else 1.0)
        exchanged = self.compressor.exchange(to_collective(self.coll, contribution), self.step_count)
        self.traffic += torch.tensor([exchanged.payload_bytes, exchanged.wire_bytes], dtype=torch.float64)
        mean = exchanged.mean_gradient
        if not bool(torch.isfinite(mean).all()):
            raise self.diverged("the all-reduced gradient")
        torch.nn.utils.vector_to_parameters(mean.to(self.device), self.grads)

    def in_sync(self) -> bool:
        """Whether the replicas must be identical now: after every step in gradients mode, after each
        averaging in parameters mode (in between, local SGD replicas differ by design)."""
        return (self.cfg.sync == "gradients" or self.step_count % self.cfg.sync_every == 0
                or self.step_count == self.plan.total_steps)

    def average_if_due(self) -> float:
        """parameters mode: every `sync_every` steps and at the end, set the sample-weighted mean of the
        replicas' parameters. Returns the seconds it took (0 when not due)."""
        if self.cfg.sync != "parameters" or not self.in_sync():
            return 0.0
        t0 = time.perf_counter()
        params = to_collective(self.coll, flat_params(self.model))
        weight = self.samples_since_sync
        flat = self.coll.allreduce_sum(torch.cat([params * weight, torch.tensor([weight], device=params.device)]))
        averaged = flat[:-1] / float(flat[-1])
        if not bool(torch.isfinite(averaged).all()):
            raise self.diverged("the averaged parameters")
        set_params(self.model, averaged)
        sent = flat.numel() * 4
        self.traffic += torch.tensor([sent, self.coll.bytes_per_allreduce(sent)], dtype=torch.float64)
        self.samples_since_sync = 0.0
        return time.perf_counter() - t0

    def end_epoch(self, epoch: int) -> None:
        """One tiny all-reduce makes the epoch's loss and accuracy global."""
        self.beat.at(self.step_count, "sync")
        samples, loss_total, correct = self.coll.allreduce_sum(self.epoch_stats.float()).double().tolist()
        self.epoch_stats = torch.zeros(3, dtype=torch.float64)
        if self.plan.weighted and samples < LEAST_TOTAL_WEIGHT:  # blocks=files: no driver-side pass summed them
            raise ValueError(total_weight_problem(samples, "the row weights") or "")
        if not np.isfinite(loss_total):
            raise self.diverged(f"epoch {epoch + 1}'s training loss")
        entry = {"epoch": epoch + 1, "step": self.step_count, "train_loss": loss_total / samples}
        if self.cfg.task == "classification":
            entry["train_accuracy"] = correct / samples
        if self.validation is not None:
            entry.update(self.validate())
        self.history.append(entry)
        if self.rank == 0:
            self.beat.progress(epoch=epoch + 1, step=self.step_count, loss=entry["train_loss"],
                               samples_per_sec=self.rate(), epoch_end=True)

    def validate(self) -> dict[str, float]:
        """Collective: the loss (and accuracy) over every rank's held-out rows, with these weights."""
        assert self.validation is not None
        x, ids, targets = self.validation
        y, _ = split_targets(targets)  # held-out rows count equally, whatever their weight
        stats = torch.zeros(3, dtype=torch.float64)
        self.model.eval()
        with torch.no_grad():
            for lo in range(0, x.shape[0], 4096):
                out = self.forward(x[lo:lo + 4096], ids[lo:lo + 4096]).float()
                stats[0] += out.shape[0]
                loss = loss_sum(out, y[lo:lo + 4096], self.cfg.task, custom=self.custom_loss,
                                label_smoothing=self.cfg.label_smoothing)
                stats[1] += float(loss)
                if self.cfg.task == "classification":
                    stats[2] += float((out.argmax(1) == y[lo:lo + 4096].long()).sum())
        self.model.train()
        samples, loss_total, correct = self.coll.allreduce_sum(stats.float()).double().tolist()
        if not samples:
            return {}
        entry = {"val_loss": loss_total / samples}
        if self.cfg.task == "classification":
            entry["val_accuracy"] = correct / samples
        return entry

    def stop_early(self) -> bool:
        """After an epoch: keep the best weights; stop once `early_stopping_patience` epochs did not improve.
        The all-reduced val_loss is the same on every rank, so every rank decides the same."""
        patience = self.cfg.early_stopping_patience
        losses = [e["val_loss"] for e in self.history if "val_loss" in e]
        if not patience or not losses:
            return False
        best = int(np.argmin(losses))
        if best == len(losses) - 1:
            self.best_params = flat_params(self.model).detach().clone()
        return len(losses) - 1 - best >= patience

    def snapshot(self) -> None:
        """Collective: when a checkpoint is due, every rank writes its part at this same step."""
        cfg, step = self.cfg, self.step_count
        if not cfg.checkpoint.dir or step % cfg.checkpoint.every_steps or step == self.plan.total_steps:
            return
        self.beat.at(step, "checkpoint")
        checkpoint.write(
            cfg.checkpoint.dir, rank=self.rank, step=step, keep=cfg.checkpoint.keep,
            barrier=lambda: self.coll.allreduce_sum(torch.zeros(1)), model=self.model,
            optimizer=self.optimizer_state(), scheduler=self.schedule, history=self.history,
            rank_state={**self.compressor.state(), "epoch_stats": self.epoch_stats, "traffic": self.traffic,
                        **({"best_params": self.best_params} if self.best_params is not None else {})},
            zero=None if self.sharded is None else (
                {"num_params": self.sharded.layout.num_params, "num_shards": self.sharded.layout.num_shards},
                self.sharded.index, self.sharded.state()),
            balance={k: self.plan.balance[k] for k in ("speeds", "fixed_seconds", "hosts", "executors", "cut",
                                                      "block_of_rank")
                     if k in self.plan.balance} if self.plan.balance else None,
        )

    def optimizer_state(self) -> dict:
        """What the checkpoint's state file holds of the optimizer: all of it, or with shard=optimizer only its
        settings (each rank writes its slice's tensors to its own `zero-K` file)."""
        state = self.optimizer.state_dict()
        return state if self.sharded is None else {"state": {}, "param_groups": state["param_groups"]}

    def diverged(self, what: str) -> TrainingDiverged:
        cfg = self.cfg
        return TrainingDiverged(
            f"training diverged at step {self.step_count}: {what} is NaN or infinite; lower train.lr "
            f"(now {cfg.lr:g}) or add train.warmup_steps, and check the features for extreme values"
        )

    def rate(self) -> float:
        """Global samples per second in this attempt so far."""
        steps = self.step_count - self.first_step
        return self.plan.total_rows * steps / self.plan.steps_per_epoch / max(time.perf_counter() - self.started, 1e-9)


def open_run_feed(plan: WorkerPlan, block: Block, rank: int, device: torch.device, step: int) -> Feed:
    """Rank `rank`'s feed from `step` to the run's end (`window_reader.open_feed`, with every later epoch's
    order): one feed for the run, so that a window reader reads the next epoch's first window while this
    one's last trains. The worker opens it for a fresh run before the rendezvous, so that the first window
    is read meanwhile."""
    cfg, per_epoch, rows = plan.config, plan.steps_per_epoch, block.rows
    first_epoch = step // per_epoch

    def order(epoch: int) -> EpochOrder:
        return epoch_order(rows, cfg.seed, rank, epoch, plan.chunks)

    first = batch_slices(rows, per_epoch)[step - first_epoch * per_epoch][0]
    return open_feed(block, order(first_epoch), first, device, (order(e) for e in range(first_epoch + 1, cfg.epochs)))


def straggle(compute_seconds: float, factor: float, extra_seconds: float) -> None:
    """A simulated straggler (`faults.slow_rank`): stretch a compute phase to `factor` times its length,
    then add `extra_seconds`."""
    delay = (factor - 1.0) * compute_seconds + extra_seconds
    if delay > 0:
        time.sleep(delay)


def _inject_fault(plan: WorkerPlan, rank: int, step: int, beat: Heartbeat) -> None:
    faults = plan.config.faults
    if faults.kill_rank != rank or faults.at_step != step or plan.attempt >= faults.repeat:
        return
    log.warning("rank %d: injecting fault %r at step %d (attempt %d)", rank, faults.mode, step, plan.attempt)
    beat.at(step, "compute")
    beat.flush()
    if faults.mode == "exit":
        os._exit(17)  # the Python worker dies like a killed process: no cleanup, no exception
    if faults.mode == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    if faults.mode == "executor":
        os.kill(_executor_jvm_pid(), signal.SIGKILL)  # the executor and every task on it are lost
    # hang: the heartbeat thread keeps reporting this step until the stage is cancelled;
    # executor: this worker waits to be torn down with its dead JVM.
    while True:
        time.sleep(3600)


def _executor_jvm_pid() -> int:
    """The JVM this Python worker serves: the nearest `java` ancestor (Linux /proc)."""
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/comm") as fh:
            if fh.read().strip() == "java":
                return pid
        with open(f"/proc/{pid}/stat") as fh:  # "pid (comm) state ppid ...": comm may hold spaces
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("faults.mode=executor: no executor JVM among this Python worker's ancestors")
