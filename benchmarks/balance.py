"""Heterogeneous workers, as slower machines: balance=even and balance=speed against equal machines.

A Spark standalone cluster on 127.0.0.1 (tests/standalone.py) of N workers, one executor and one task
slot each. Every worker JVM starts inside its own cgroup v1 cpu group, so its executor and the executor's
Python workers (its children) share that group's CPU capacity: cpu.cfs_quota_us = cores x
cpu.cfs_period_us (PERIOD_US). The machine's capacity is split: with equal machines (`none`) every
worker gets CAPACITY_CORES / N cores; a slower machine gets a fraction of that share (CASES). The
capacity is 1.8 of the 2 cores, so the driver, the master and the OS have the rest and the caps, not
contention, set each rank's pace.

The job (`balance_job.py`, one Spark application per N): `train_files` on ROWS synthetic rows x 64
features, blocksync's `mlp` (64 -> 256 -> 256 -> 2), Adam, a global batch of 4,096, 4 epochs, torch_gloo,
one torch thread per rank. Each round runs `none` (equal caps, balance=even), then per case `even`, `speed`
and `proportional` (the case's caps; `proportional` is balance=speed cut in proportion to the probe's rates
at the even batch, the rule before the cut modelled a step's fixed cost), REPETITIONS rounds, alternating.
Reported: medians of metrics.json
`samples_per_sec` (the training loop; the probe's cost, `probe_seconds`, beside it), each contender over
`none`, and the capacity bound sum(shares) / N (a balanced run can at best use the capacity there is:
0.75 at N=2 and 0.875 at N=4 with one worker at half its share) with the fraction of it speed reaches.
Also counted: the speed runs where Spark placed the training tasks on other executors than the probe's
(the ranks then read the block cut for their executor, `worker.placement`), and ranks left misplaced.
Needs root and a cgroup v1 cpu controller; elsewhere it says why and writes nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.cgroup import empty_and_remove
from benchmarks.common import median, write

ROWS = 65_536
FEATURES = 64
CAPACITY_CORES = 1.8
PERIOD_US = 10_000
CASES = {2: {"one slow": [0.5, 1.0]}, 4: {"one slow": [0.5, 1.0, 1.0, 1.0], "mixed": [0.5, 0.75, 1.0, 1.0]}}
"""Per N, per case: each worker's share of an equal machine's capacity (worker 0 is the slow one)."""
CONTENDERS = ("even", "speed", "proportional")
"""Per case, alternating: balance=even, balance=speed, and balance=speed cut in proportion to the probe's rates
at the even batch (the rule before the cut modelled a step's fixed cost; `balance_job.one`)."""
REPETITIONS = int(os.environ.get("BLOCKSYNC_BENCH_REPETITIONS", "3"))
CONF = {"spark.executor.cores": "1", "spark.task.cpus": "1", "spark.executor.memory": "1g",
        "spark.driver.memory": "2g", "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.python.daemon.module": "blocksync.daemon"}
REPO = Path(__file__).resolve().parent.parent


def _files(folder: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float64)
    (folder / "data").mkdir()
    pq.write_table(pa.table({"features": pa.array(list(x), pa.list_(pa.float32())), "label": y}),
                   folder / "data" / "part-0.parquet", row_group_size=4096)
    return str(folder / "data")


def _schedule(workers: int) -> list[dict]:
    equal = [CAPACITY_CORES / workers] * workers
    rounds = []
    for _ in range(REPETITIONS):
        rounds.append({"case": "none", "contender": "none", "cores": equal})
        for case, shares in CASES[workers].items():
            cores = [s * CAPACITY_CORES / workers for s in shares]
            rounds += [{"case": case, "contender": c, "cores": cores} for c in CONTENDERS]
    return rounds


def _on_cluster(tmp: Path, data: str, workers: int, parent: Path) -> list[dict]:
    """One standalone cluster of `workers` capped workers, one job over the schedule; cgroups removed after."""
    from tests.standalone import StandaloneCluster

    groups = [parent / f"blocksync-balance-{os.getpid()}-{workers}-{i}" for i in range(workers)]
    for g in groups:
        g.mkdir()
    try:
        cluster = StandaloneCluster(tmp / f"cluster{workers}", num_workers=workers, cores=1, memory="2g",
                                    worker_cgroups=groups)
        (tmp / f"cluster{workers}").mkdir()
        cluster.start()
        try:
            out = tmp / f"runs{workers}.json"
            params = {"period_us": PERIOD_US, "cgroups": [str(g) for g in groups], "schedule": _schedule(workers)}
            proc = cluster.submit(str(REPO / "benchmarks" / "balance_job.py"), data, str(out), json.dumps(params),
                                  conf={**CONF, "spark.cores.max": str(workers)}, timeout=3000)
            if proc.returncode != 0 or not out.exists():
                # The Python error, not only the tail of Spark's INFO lines that follow it.
                error = proc.stderr[proc.stderr.rfind("Traceback"):][:3000] if "Traceback" in proc.stderr else ""
                raise RuntimeError(f"balance job on {workers} workers failed (exit {proc.returncode}):\n"
                                   f"{proc.stdout[-1500:]}\n{error}\n...\n{proc.stderr[-1500:]}")
            print(proc.stdout, flush=True)
            return json.loads(out.read_text())
        finally:
            cluster.stop()
    finally:
        for g in groups:
            empty_and_remove(g)


def summarize(workers: int, runs: list[dict]) -> list[dict]:
    none = median([r["samples_per_sec"] for r in runs if r["contender"] == "none"])
    out = []
    for case, shares in CASES[workers].items():
        rate = {c: median([r["samples_per_sec"] for r in runs if r["case"] == case and r["contender"] == c])
                for c in CONTENDERS}
        speed_runs = [r for r in runs if r["case"] == case and r["contender"] == "speed"]
        bound = sum(shares) / workers
        out.append({
            "num_workers": workers, "case": case, "shares": shares, "none": none, **rate,
            "even_vs_none": rate["even"] / none, "speed_vs_none": rate["speed"] / none, "bound": bound,
            "proportional_vs_none": rate["proportional"] / none,
            "speed_vs_proportional": rate["speed"] / rate["proportional"],
            "fraction_of_bound": rate["speed"] / none / bound,
            "probe_seconds": median([r["probe_seconds"] for r in speed_runs]),
            "placed_elsewhere": sum(r["block_of_rank"] != list(range(workers)) for r in speed_runs),
            "misplaced_ranks": sum(len(r["misplaced_ranks"]) for r in speed_runs),
            "speed_runs": len(speed_runs), "block_sizes": speed_runs[-1]["block_sizes"],
        })
    return out


def run(spark=None) -> dict:
    from tests.helpers import own_cgroup

    parent = own_cgroup("cpu")
    if parent is None:  # the other benchmarks still run; the recorded results stay as they are
        print("balance benchmark skipped: needs root and a writable cgroup v1 cpu controller", flush=True)
        return {}
    results, runs = [], {}
    with tempfile.TemporaryDirectory(prefix="blocksync-balance-") as name:
        tmp = Path(name)
        data = _files(tmp)
        for workers in CASES:
            runs[workers] = _on_cluster(tmp, data, workers, parent)
            results += summarize(workers, runs[workers])
    payload = {"rows": ROWS, "features": FEATURES, "capacity_cores": CAPACITY_CORES, "period_us": PERIOD_US,
               "repetitions": REPETITIONS, "cases": results, "runs": runs}
    write("balance", payload, markdown(results))
    return payload


def markdown(results: list[dict]) -> str:
    lines = ["# balance: slower machines (per-worker CPU caps), balance=even vs speed vs equal machines", "",
             f"Standalone cluster, one executor per worker, each worker in a cgroup of {CAPACITY_CORES:g} / N cores x "
             "its share; medians of samples/s; bound = sum(shares) / N.", "",
             "| N | case | shares | none samples/s | even (x none) | speed (x none) | proportional (x none) | "
             "speed / proportional | bound | speed / bound | speed blocks | probe s | placed elsewhere / misplaced |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in results:
        lines.append(
            f"| {c['num_workers']} | {c['case']} | {c['shares']} | {c['none']:,.0f} | {c['even']:,.0f} "
            f"({c['even_vs_none']:.2f}x) | {c['speed']:,.0f} ({c['speed_vs_none']:.2f}x) | {c['proportional']:,.0f} "
            f"({c['proportional_vs_none']:.2f}x) | {c['speed_vs_proportional']:.2f} | {c['bound']:.3f} | "
            f"{c['fraction_of_bound']:.0%} | {c['block_sizes']} | {c['probe_seconds']:.2f} | "
            f"{c['placed_elsewhere']} of {c['speed_runs']} / {c['misplaced_ranks']} |")
    return "\n".join(lines) + "\n"
