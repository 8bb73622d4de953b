"""Driver side of `balance: speed`: probe every rank's step rate, or reuse a checkpoint's, and cut by it
(or evenly, when the speeds are within `SPEED_TOLERANCE`); `placement` checks where the blocks then ran."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from blocksync.engine import checkpoint
from blocksync.engine.balance import (
    SPEED_TOLERANCE,
    balanced_speeds,
    check_shares,
    shared_fixed_seconds,
    weighted_sizes,
    within_tolerance,
)
from blocksync.engine.config import TrainConfig
from blocksync.engine.inputs import InputSpec
from blocksync.engine.worker.block_data import steps_per_epoch
from blocksync.engine.worker.probe import PROBE_SCHEMA_DDL, make_probe

log = logging.getLogger(__name__)


@dataclass
class Balance:
    """What `balance: speed` measured and cut: per probe rank (= block), rows per second at the even local batch,
    the step's fixed seconds, host, executor and block rows."""

    speeds: list[float] = field(default_factory=list)
    fixed_seconds: list[float] = field(default_factory=list)
    """Per rank, the seconds of a step that do not grow with its rows (`balance.step_fixed_seconds`); empty (all
    zero) for a checkpoint saved before they were measured, whose cut is then rebuilt as it was made."""
    hosts: list[str] = field(default_factory=list)
    executors: list[str] = field(default_factory=list)
    """The executor (Spark's task address, host:port) each speed was measured on: block b is cut for
    `executors[b]`, and with blocks=files the rank training there reads it (`worker.placement`)."""
    sizes: list[int] = field(default_factory=list)
    probe_seconds: float = 0.0
    probe_start_seconds: float = 0.0
    """Of `probe_seconds`, the submission to the last rank's probe starting (`probe.make_probe`'s `start_s`):
    mostly the Python workers' start, which the training stage skips where Spark reuses them."""
    source: str = "probe"
    """`probe`: measured now; `checkpoint`: the speeds saved with the checkpoint this run resumes."""
    cut: str = "speed"
    """`speed`: sizes follow the speeds; `even`: the speeds were within SPEED_TOLERANCE, so the cut is even's."""
    rule: str = ""
    """How a speed cut was sized: `step times` (the speeds and the fixed costs) or `proportional` (the speeds)."""
    probes: int = 1
    """Probe stages run: 2 when the first left a rank under one row per step (measured again before refusing)."""

    def to_dict(self) -> dict:
        return {"speeds": self.speeds, "fixed_seconds": self.fixed_seconds, "hosts": self.hosts,
                "executors": self.executors, "sizes": self.sizes,
                "probe_seconds": self.probe_seconds, "probe_start_seconds": self.probe_start_seconds,
                "source": self.source, "cut": self.cut, "rule": self.rule, "probes": self.probes}


def measure(spark: SparkSession, config: TrainConfig, num_features: int, num_outputs: int,
            inputs: InputSpec | None, total_rows: int) -> Balance:
    """One barrier stage of `num_workers` tasks, each timing training steps of the even local batch and of half
    of it."""
    batch_rows = probe_rows(config, total_rows)
    started = time.perf_counter()
    probe = make_probe(config, num_features, num_outputs, inputs, batch_rows, time.time())
    n = config.num_workers
    rows = spark.range(n, numPartitions=n).mapInArrow(probe, PROBE_SCHEMA_DDL, barrier=True).collect()
    facts = sorted((json.loads(r["payload"]) for r in rows), key=lambda f: f["rank"])
    seconds = time.perf_counter() - started
    balance = Balance(speeds=[float(f["rows_per_s"]) for f in facts],
                      fixed_seconds=[float(f["fixed_s"]) for f in facts], hosts=[f["host"] for f in facts],
                      executors=[f["executor"] for f in facts], probe_seconds=round(seconds, 4),
                      probe_start_seconds=round(max(f["start_s"] for f in facts), 4))
    log.info("balance=speed probe (%.2f s, %.2f s of it until the last rank's probe started): rows/s per rank %s "
             "at %d rows a step, of which fixed per step (ms) %s", seconds, balance.probe_start_seconds,
             [round(s) for s in balance.speeds], batch_rows, [round(1e3 * f, 2) for f in balance.fixed_seconds])
    return balance


def probe_rows(config: TrainConfig, total_rows: int) -> int:
    """The even local batch, which the probe times (and half of it)."""
    return max(1, -(-min(config.batch_size, total_rows) // config.num_workers))


def saved(config: TrainConfig) -> Balance | None:
    """The balance saved with the checkpoint this run will resume from, if any."""
    path = checkpoint.latest(config.checkpoint.dir)
    found = checkpoint.read(path).balance if path else None
    if not found:
        return None
    if len(found["speeds"]) != config.num_workers:
        raise ValueError(f"checkpoint {path} was cut for {len(found['speeds'])} workers by balance=speed but "
                         f"num_workers={config.num_workers}; keep num_workers, or use an empty checkpoint.dir.")
    return Balance(speeds=found["speeds"], fixed_seconds=found.get("fixed_seconds", []), hosts=found["hosts"],
                   executors=found.get("executors", []), source="checkpoint")


def cutter(spark: SparkSession, config: TrainConfig, outputs: Callable[[tuple[float, float, int]], int],
           chosen: list[Balance]) -> Callable[[int, tuple | None, InputSpec | None, int], list[int] | None]:
    """The `cut` callback `make_blocks` and `plan_shards` call once they know the data's shape and rows:
    it measures (or reuses) the speeds and returns the block sizes, or None (the even cut) when the speeds
    are within SPEED_TOLERANCE; the `Balance` lands in `chosen`."""

    def cut(num_features: int, labels: tuple | None, inputs: InputSpec | None, total_rows: int) -> list[int] | None:
        assert labels is not None, "make_blocks and plan_shards pass the label facts they found"
        balance = saved(config)
        if balance is None:
            balance = measure(spark, config, num_features, outputs(labels), inputs, total_rows)
            starved = _starved(balance, config, total_rows)
            if starved is not None:
                # One probe can catch a rank at a bad moment (other tasks still starting on its cores); a rank
                # starved twice is refused below, by name.
                log.warning("balance=speed: the probe left rank %d under one row per step (%.0f rows/s against the "
                            "fastest %.0f); probing once more", starved, balance.speeds[starved], max(balance.speeds))
                first_seconds = balance.probe_seconds
                balance = measure(spark, config, num_features, outputs(labels), inputs, total_rows)
                balance.probes, balance.probe_seconds = 2, round(first_seconds + balance.probe_seconds, 4)
        chosen.append(balance)
        if within_tolerance(balance.speeds):
            balance.cut = "even"
            log.info("balance=speed: speeds within tolerance, cut even (slowest %.0f rows/s is within %.0f%% of "
                     "the fastest %.0f)", min(balance.speeds), 100 * SPEED_TOLERANCE, max(balance.speeds))
            return None
        balance.sizes, balance.rule = _sizes(balance, config, total_rows)
        if balance.rule == "proportional" and any(balance.fixed_seconds):
            log.warning("balance=speed: cut in proportion to the measured speeds, not by predicted step times: a "
                        "step is mostly fixed cost at %d rows a rank (no cut of the rows shortens it), and that "
                        "model would leave a rank under one row per step", probe_rows(config, total_rows))
        check_shares(balance.sizes, steps_per_epoch(total_rows, config.batch_size), balance.speeds, balance.hosts)
        return balance.sizes

    return cut


def _sizes(balance: Balance, config: TrainConfig, total_rows: int) -> tuple[list[int], str]:
    """The block sizes and the rule that gave them: `step times` (`shared_fixed_seconds`, `balanced_speeds`,
    `weighted_sizes`) where that leaves every rank at least one row per step, else `proportional` (the measured
    speeds as they are: no fixed costs measured, as in a checkpoint saved before they were, or a step so
    dominated by them that the model would starve a rank for no gain)."""
    proportional = weighted_sizes(total_rows, balance.speeds)
    if not any(balance.fixed_seconds):
        return proportional, "proportional"
    rows = probe_rows(config, total_rows)
    fixed = shared_fixed_seconds(rows, balance.speeds, balance.fixed_seconds)
    sizes = weighted_sizes(total_rows, balanced_speeds(min(config.batch_size, total_rows), rows, balance.speeds, fixed))
    if min(sizes) >= steps_per_epoch(total_rows, config.batch_size):
        return sizes, "step times"
    return proportional, "proportional"


def _starved(balance: Balance, config: TrainConfig, total_rows: int) -> int | None:
    """The first rank a cut by these speeds would leave under one row per step, if any (none when they cut even)."""
    if within_tolerance(balance.speeds):
        return None
    steps = steps_per_epoch(total_rows, config.batch_size)
    return next((r for r, n in enumerate(_sizes(balance, config, total_rows)[0]) if n < steps), None)


def placement(balance: dict, block_of_rank: list[int], train_executors: list[str]) -> list[int]:
    """The ranks that trained on another executor than the one their block was cut for (the probe's): Spark
    places each stage's tasks afresh, and with blocks=shuffle a partition's rows cannot follow the executor.
    Empty when the cut is even, or when the probe's executors cannot be told apart (local mode)."""
    probe = balance.get("executors") or []
    if balance.get("cut") != "speed" or len(set(probe)) < 2 or len(probe) != len(block_of_rank):
        return []
    return [r for r, b in enumerate(block_of_rank) if probe[b] != train_executors[r]]
