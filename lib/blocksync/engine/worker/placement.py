"""`balance: speed` with blocks=files: every rank reads the block that was cut for the executor it runs on.

Spark places each stage's tasks afresh (it shuffles its offers), so training's task r may run on another
executor than the probe's task r, whose speed sized block r. A rank of blocks=files reads its rows itself, so
it can read any block: `block_of_rank` gives rank r the block measured on its own executor. Ranks keep their
partition ids for everything else (seeds, collectives, checkpoint parts). A relaunch resuming a checkpoint
reads the assignment saved with it, so it resumes bitwise wherever Spark places it this time.
"""

from __future__ import annotations

from typing import Any

from blocksync.engine import checkpoint
from blocksync.engine.plan import WorkerPlan


def block_of_rank(plan: WorkerPlan, addresses: list[str]) -> list[int]:
    """Which block each rank (partition id) reads, given every task's executor address (getTaskInfos, in
    partition order, the same on every rank). The identity unless blocks=files with a speed cut and the
    training tasks run on the probe's executors: then, in rank order, each rank takes the lowest block not yet
    taken whose probe ran on its executor (several slots of one executor share its blocks)."""
    balance = plan.balance or {}
    identity = list(range(len(addresses)))
    if not plan.shards or balance.get("cut") != "speed":
        return identity
    if plan.resume_from:
        saved = checkpoint.read_manifest(plan.resume_from).get("balance") or {}
        if saved.get("block_of_rank"):
            return list(saved["block_of_rank"])
    probe = list(balance.get("executors") or [])
    if sorted(probe) != sorted(addresses):  # other executors than the probe's (or none recorded): keep ids
        return identity
    free: dict[str, list[int]] = {}
    for block, executor in enumerate(probe):
        free.setdefault(executor, []).append(block)
    return [free[a].pop(0) for a in addresses]


def task_addresses(ctx: Any) -> list[str]:
    return [info.address for info in ctx.getTaskInfos()]
