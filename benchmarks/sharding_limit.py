"""A cgroup memory limit that refuses the replicated run before training and lets the sharded run train.

`sharding`'s 21.5M-parameter mlp with Adam, 4 horovod workers on local[4], Spark's Python workers in a
cgroup v1 memory controller of their own (`cgroup.child_cgroup`; the daemon joins it before it imports
anything). The limit follows from the arithmetic: a first sharded run without a limit measures the
cgroup's peak; the limit is that peak plus half the difference between what 4 replicated ranks and 4
sharded ranks add to their built models by `sharding.training_state_bytes` (the README's arithmetic).
So the replicated run's check (`state_fits`) finds that much more missing than it has left, and the
sharded run has that much to spare. Then shard=none and shard=optimizer run under the limit. Recorded:
each run's outcome (the error a user reads, or steps and each rank's peak RssAnon), the cgroup's peak
usage and how often it hit the limit. Needs root and a cgroup v1 memory controller; elsewhere it says
why and writes nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.helpers import own_memory_cgroup

from benchmarks.cgroup import REPO, child_cgroup, run_job, set_limit
from benchmarks.common import write
from benchmarks.sharding_limit_job import WORKERS, config


def arithmetic_mb() -> dict[str, float]:
    """What the WORKERS ranks add to their built models, replicated and sharded, by the README's arithmetic."""
    from benchmarks.sharding import FEATURES, HIDDEN
    from blocksync import ModelSpec
    from blocksync.engine.comm.sharding import training_state_bytes
    from blocksync.engine.models import build_model

    sizes = [p.numel() for p in build_model(ModelSpec(name="mlp", hidden=HIDDEN), FEATURES, 2).parameters()]
    return {shard: WORKERS * sum(training_state_bytes(sum(sizes), config(shard), WORKERS, max(sizes)).values()) / 2**20
            for shard in ("none", "optimizer")}


def run(spark) -> dict | None:
    parent = own_memory_cgroup()
    if parent is None:
        print("sharding_limit: skipped: needs root and a writable cgroup v1 memory controller", flush=True)
        return None
    need = arithmetic_mb()
    margin = (need["none"] - need["optimizer"]) / 2
    runs = []
    with child_cgroup(parent, "blocksync-sharding") as cgroup, \
            tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        calibration = run_job(cgroup, "sharding_limit_job.py", ["-", "optimizer"], Path(tmp) / "calibration.json")
        print(f"sharding_limit calibration: {calibration}", flush=True)
        if not calibration["ok"]:
            raise RuntimeError(f"the calibration run failed: {calibration['error']}")
        limit_mb = int(calibration["cgroup_peak_mb"] + margin)
        set_limit(cgroup, limit_mb)
        for shard in ("none", "optimizer"):
            runs.append(run_job(cgroup, "sharding_limit_job.py", ["-", shard], Path(tmp) / f"{shard}.json"))
            print(f"sharding_limit {shard}: {runs[-1]}", flush=True)
    payload = {"limit_mb": limit_mb, "margin_mb": margin, "arithmetic_mb": need, "calibration": calibration,
               "runs": runs}
    write("sharding_limit", payload, markdown(payload))
    return payload


def markdown(p: dict) -> str:
    need, cal = p["arithmetic_mb"], p["calibration"]
    lines = [f"# A 21.5M-parameter mlp with Adam, {WORKERS} horovod workers, Python workers under a "
             f"{p['limit_mb']:,} MiB cgroup memory limit", "",
             f"The limit: the cgroup's peak in a sharded run without a limit ({cal['cgroup_peak_mb']:,.0f} MiB) plus "
             f"{p['margin_mb']:,.0f} MiB, half the difference between what {WORKERS} ranks add to their built models "
             f"by the arithmetic replicated ({need['none']:,.0f} MiB) and sharded ({need['optimizer']:,.0f} MiB).", "",
             "| shard | outcome | seconds | peak RssAnon per rank | cgroup peak (page cache included) | limit hits |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in p["runs"]:
        outcome = (f"completed: {r['steps']} steps, optimizer state {max(r['optimizer_bytes_per_rank']) / 2**20:,.1f} "
                   "MiB per rank" if r["ok"] else f"refused ({r['kind']}): {r['error']}")
        anon = f"{max(r['peak_anon_mb']):,.0f} MiB" if r["ok"] else "-"
        lines.append(f"| {r['shard']} | {outcome} | {r['seconds']:.0f} | {anon} | "
                     f"{r['cgroup_peak_mb']:,.0f} MiB | {r['cgroup_limit_hits']} |")
    return "\n".join(lines) + "\n"
