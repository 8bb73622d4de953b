"""A block 4x larger than the Python workers' enforced memory limit: `disk` completes, `memory` is refused.

The limit is a cgroup's (memory.limit_in_bytes, cgroup v1), as YARN and Kubernetes enforce a
container's memory: the kernel counts every page of the cgroup's processes, page cache included, and
kills a process whose cgroup cannot reclaim enough. Spark's own spark.executor.pyspark.memory is an
address-space limit (RLIMIT_AS), which torch, pyarrow's allocator and Gloo's threads exceed by
reserving address space they never use, so it is not the limit measured here.

The benchmark makes a child cgroup of its own with LIMIT_MB, writes Parquet with one block of 4 x
LIMIT_MB, and runs `memory_limit_job.py` (local[2], one worker) twice: block_storage=memory, then
disk. Spark's Python daemon joins the cgroup before it imports anything (`cgroup_daemon.py`), so
every Python worker, forked from it, is under the limit. Recorded: each run's outcome (the error a
user reads, or steps, samples/s and the rank's peak RSS), the cgroup's peak usage (page cache
included) and how often it hit the limit. Needs root and a cgroup v1 memory controller; elsewhere
it says why and writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.helpers import own_memory_cgroup

from benchmarks.cgroup import REPO, child_cgroup
from benchmarks.cgroup import run_job as cgroup_job
from benchmarks.common import write
from benchmarks.memory import ROW_BYTES, synthetic_files

LIMIT_MB = 512
GROUP_ROWS = 4096
FACTOR = 4


CONTENDERS = [("disk", "chunks", "limited"), ("stream", "chunks", "limited"), ("memory", "global", "unlimited")]
"""Alternating, REPETITIONS times, after the refused `memory` run: the chunk order on disk and streamed under
the limit, against the same job in memory without a limit (the target: >= 0.8x its samples/s)."""
REPETITIONS = int(os.environ.get("BLOCKSYNC_BENCH_REPETITIONS", "1"))


def run_job(cgroup: Path, data: str, storage: str, tmp: Path, order: str = "global", limited: bool = True) -> dict:
    """One `memory_limit_job.py` run (argv: data, result file, `storage`, `order`, limited or not) in `cgroup`."""
    return cgroup_job(cgroup, "memory_limit_job.py", [data, storage, order, "limited" if limited else "unlimited"],
                      tmp / f"{storage}-{order}.json", limited)


def run(spark) -> dict | None:
    parent = own_memory_cgroup()
    if parent is None:
        print("memory_limit: skipped: needs root and a writable cgroup v1 memory controller", flush=True)
        return None
    runs = []
    with child_cgroup(parent, "blocksync-bench", LIMIT_MB) as cgroup, \
            tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        # Row groups of 4 MiB: what a worker decodes at once (loading, or streaming) stays small beside the
        # 270 MiB that torch and the Python worker take under the 512 MiB limit.
        data = synthetic_files(Path(tmp), FACTOR * LIMIT_MB, workers=1, group_rows=GROUP_ROWS)
        runs.append(run_job(cgroup, data, "memory", Path(tmp)))
        print(f"memory_limit memory: {runs[-1]}", flush=True)
        for rep in range(REPETITIONS):
            for storage, order, limited in CONTENDERS:
                runs.append(run_job(cgroup, data, storage, Path(tmp), order, limited == "limited"))
                print(f"memory_limit rep {rep + 1} {storage} {order} {limited}: {runs[-1]}", flush=True)
    block_mb = int(FACTOR * LIMIT_MB * 2**20 / ROW_BYTES) * ROW_BYTES / 2**20
    payload = {"limit_mb": LIMIT_MB, "block_mb": block_mb, "runs": runs, "ratios": _ratios(runs)}
    write("memory_limit", payload, _markdown(payload))
    return payload


def _median(values: list[float]) -> float:
    values = sorted(values)
    return (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2


def _ratios(runs: list[dict]) -> dict[str, float]:
    """Each limited contender's median samples/s over the unlimited memory run's."""
    def rate(storage: str, limited: bool) -> list[float]:
        return [r["samples_per_sec"] for r in runs if r["ok"] and r["storage"] == storage and r["limited"] == limited]

    base = rate("memory", False)
    return {s: _median(rate(s, True)) / _median(base) for s in ("disk", "stream") if base and rate(s, True)}


def _markdown(p: dict) -> str:
    lines = [f"# A {p['block_mb']:,.0f} MiB block under a {p['limit_mb']} MiB cgroup memory limit (one worker, "
             "logistic regression, one epoch)", "",
             "`memory` without a limit is the baseline; contenders alternate. Memory: the rank's peak RSS (mapped "
             "and cached file pages included), its peak anonymous memory (RssAnon, sampled every 20 ms)"
             " and the cgroup's peak (page cache included).", "",
             "| block_storage | epoch_order | limit | outcome | seconds | data p50 / p95 | read (overlapped) | "
             "peak RSS | peak RssAnon | cgroup peak | limit hits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["runs"]:
        outcome = (f"completed: {r['steps']} steps, {r['samples_per_sec']:,.0f} samples/s" if r["ok"]
                   else f"refused ({r['kind']}): {r['error']}")
        ok = r["ok"]
        data = f"{r['data_p50_ms']:.1f} / {r['data_p95_ms']:.1f} ms" if ok and "data_p50_ms" in r else "-"
        read = f"{sum(r['read_seconds']):.1f} s" if ok and "read_seconds" in r else "-"
        rss = f"{max(r['peak_rss_mb']):,.0f} MiB" if ok else "-"
        anon = f"{max(r['peak_anon_mb']):,.0f} MiB" if ok and r.get("peak_anon_mb") else "-"
        cgroup = f"{r['cgroup_peak_mb']:,.0f} MiB" if "cgroup_peak_mb" in r else "no limit"
        hits = str(r["cgroup_limit_hits"]) if "cgroup_limit_hits" in r else "-"
        lines.append(f"| {r['storage']} | {r.get('order', 'global')} | {'yes' if r.get('limited', True) else 'no'} | "
                     f"{outcome} | {r['seconds']:.0f} | {data} | {read} | {rss} | {anon} | {cgroup} | {hits} |")
    lines += ["", "Samples/s under the limit over `memory` without one (medians): "
              + ", ".join(f"{k} {v:.2f}x" for k, v in p["ratios"].items())]
    return "\n".join(lines) + "\n"
