"""Does a cgroup memory limit that the sharded run fits refuse the replicated run? (The intended demonstration
of shard=optimizer: a replicated run refused before its allocations, a sharded one trained.)

`sharding`'s 21.5M-parameter mlp with Adam, 4 horovod workers on local[4], Spark's Python workers
in a cgroup v1 memory controller (as `memory_limit` sets one up: the daemon joins it before it imports
anything). The limit is calibrated, not guessed: a first sharded run without a limit measures the
cgroup's peak; the limit is that peak plus MARGIN_MB. Then shard=none and shard=optimizer run under it.
Recorded: each run's outcome (the error a user reads, or steps and each rank's peak RssAnon), the
cgroup's peak usage and how often it hit the limit; the result says which way it went (at the recorded
commit the replicated run completed: its cgroup peak was below the sharded run's). Needs root and a
cgroup v1 memory controller; elsewhere it says why and writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.helpers import own_memory_cgroup

from benchmarks.common import write
from benchmarks.memory_limit import REPO, run_job, stop_leftovers

MARGIN_MB = 150


def run(spark) -> dict | None:
    parent = own_memory_cgroup()
    if parent is None:
        print("sharding_limit: skipped: needs root and a writable cgroup v1 memory controller", flush=True)
        return None
    cgroup = parent / f"blocksync-sharding-{os.getpid()}"
    cgroup.mkdir()
    runs = []
    try:
        with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
            (cgroup / "memory.limit_in_bytes").write_text("-1")  # no limit: measure the sharded run's peak
            calibration = run_job(cgroup, "-", "optimizer", Path(tmp), script="sharding_limit_job.py")
            print(f"sharding_limit calibration: {calibration}", flush=True)
            if not calibration["ok"]:
                raise RuntimeError(f"the calibration run failed: {calibration['error']}")
            limit_mb = int(calibration["cgroup_peak_mb"] + MARGIN_MB)
            (cgroup / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
            for shard in ("none", "optimizer"):
                runs.append(run_job(cgroup, "-", shard, Path(tmp), script="sharding_limit_job.py"))
                print(f"sharding_limit {shard}: {runs[-1]}", flush=True)
    finally:
        stop_leftovers(cgroup)
        cgroup.rmdir()
    payload = {"limit_mb": limit_mb, "margin_mb": MARGIN_MB, "calibration": calibration, "runs": runs}
    lines = [f"# A 21.5M-parameter mlp with Adam, 4 horovod workers, Python workers under a {limit_mb:,} MiB cgroup "
             "memory limit", "",
             "The limit: the cgroup's peak in a sharded run without a limit "
             f"({calibration['cgroup_peak_mb']:,.0f} MiB) plus {MARGIN_MB} MiB.", "",
             "| shard | outcome | seconds | peak RssAnon per rank | cgroup peak (page cache included) | limit hits |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        outcome = (f"completed: {r['steps']} steps, optimizer state {max(r['optimizer_bytes_per_rank']) / 2**20:,.1f} "
                   "MiB per rank" if r["ok"] else f"refused ({r['kind']}): {r['error']}")
        anon = f"{max(r['peak_anon_mb']):,.0f} MiB" if r["ok"] else "-"
        lines.append(f"| {r['shard']} | {outcome} | {r['seconds']:.0f} | {anon} | "
                     f"{r['cgroup_peak_mb']:,.0f} MiB | {r['cgroup_limit_hits']} |")
    write("sharding_limit", payload, "\n".join(lines) + "\n")
    return payload
