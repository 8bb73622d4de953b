"""A block 4x larger than the Python workers' enforced memory limit: `memory` is refused; `disk` and `stream`
(epoch_order=chunks) train under it, against `memory` without a limit, for a reading-bound job and a
compute-bound one, beside the disk's sequential read speed under the limit (the reading-bound job's ceiling).

The limit is a cgroup's (memory.limit_in_bytes, cgroup v1), as YARN and Kubernetes enforce a
container's memory: the kernel counts every page of the cgroup's processes, page cache included, and
kills a process whose cgroup cannot reclaim enough. Spark's own spark.executor.pyspark.memory is an
address-space limit (RLIMIT_AS), which torch, pyarrow's allocator and Gloo's threads exceed by
reserving address space they never use, so it is not the limit measured here.

The benchmark makes a child cgroup of its own with LIMIT_MB, writes Parquet with one block of 4 x
LIMIT_MB, and runs `memory_limit_job.py` (local[2], one worker): block_storage=memory (refused),
then CONTENDERS for each of MODELS, alternating. Spark's Python daemon joins the cgroup before it
imports anything (`cgroup_daemon.py`), so
every Python worker, forked from it, is under the limit. Recorded: each run's outcome (the error a
user reads, or steps, samples/s and the rank's peak RSS), the cgroup's peak usage (page cache
included) and how often it hit the limit. Needs root and a cgroup v1 memory controller; elsewhere
it says why and writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
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
"""Alternating, REPETITIONS times for each of MODELS, after the refused `memory` run: the chunk order on disk and
streamed under the limit, against the same job in memory without a limit (the target: >= 0.8x its samples/s)."""
MODELS = ("logreg", "mlp")
"""logreg reads about 1 GB/s of rows in memory, so under the limit it is bound by the storage's read speed;
the mlp (hidden [128, 64]) computes about 7x longer a row, so reading can hide behind its steps."""
READ_MB = 4
REPETITIONS = int(os.environ.get("BLOCKSYNC_BENCH_REPETITIONS", "2"))


def run_job(cgroup: Path, data: str, storage: str, tmp: Path, order: str = "global", limited: bool = True,
            model: str = "logreg") -> dict:
    """One `memory_limit_job.py` run (argv: data, result file, `storage`, `order`, limited or not, `model`) in
    `cgroup`, with the Parquet file's pages dropped first: every run reads it from the disk."""
    drop_cache(data)
    return cgroup_job(cgroup, "memory_limit_job.py",
                      [data, storage, order, "limited" if limited else "unlimited", model],
                      tmp / f"{model}-{storage}-{order}.json", limited)


def drop_cache(path: str) -> None:
    """Evict a file's pages from the page cache (they are clean: written and synced before)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


READER = """import os, sys, time
open(os.path.join(sys.argv[1], "cgroup.procs"), "w").write(str(os.getpid()))
fd, buf, done = os.open(sys.argv[2], os.O_RDONLY), bytearray(int(sys.argv[3])), 0
start = time.perf_counter()
while (got := os.readv(fd, [buf])) > 0:
    done += got
print(done / (time.perf_counter() - start) / 2**20)
"""


def read_ceiling(cgroup: Path, path: str) -> float:
    """MiB/s of one sequential pass over `path` (cache dropped first) in READ_MB reads by a process in
    `cgroup`: the most any reader of this disk gets under the limit."""
    drop_cache(path)
    proc = subprocess.run([sys.executable, "-c", READER, str(cgroup), path, str(READ_MB * 2**20)],
                          capture_output=True, text=True, timeout=600, check=True)
    return float(proc.stdout)


DECODER = """import os, sys, time
open(os.path.join(sys.argv[1], "cgroup.procs"), "w").write(str(os.getpid()))
import pyarrow.fs as pafs
from blocksync.engine.worker.parquet_direct import DirectRowGroups
f, rows = DirectRowGroups.open(pafs.LocalFileSystem(), sys.argv[2]), 0
start = time.perf_counter()
for group in range(f.metadata.num_row_groups):
    rows += f.read_row_group(group, ["features", "label"]).num_rows
print(rows / (time.perf_counter() - start))
"""


def decode_ceiling(cgroup: Path, path: str) -> float:
    """Rows/s of reading and decoding `path` row group by row group on one thread, as `stream`'s reader does
    (`parquet_direct`: one O_DIRECT read a row group, pyarrow's decoder) without converting or checking the
    rows, cache dropped first, by a process in `cgroup`: the most samples/s a `stream` run of one worker can
    reach, whatever its model."""
    drop_cache(path)
    proc = subprocess.run([sys.executable, "-c", DECODER, str(cgroup), path],
                          capture_output=True, text=True, timeout=600, check=True)
    return float(proc.stdout)


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
        ceiling = [read_ceiling(cgroup, data) for _ in range(2)]
        print(f"memory_limit sequential read of the data under the limit: {ceiling} MiB/s", flush=True)
        decoded = [decode_ceiling(cgroup, data) for _ in range(2)]
        print(f"memory_limit decoding the data on one thread under the limit: {decoded} rows/s", flush=True)
        runs.append(run_job(cgroup, data, "memory", Path(tmp)))
        print(f"memory_limit memory: {runs[-1]}", flush=True)
        for rep in range(REPETITIONS):
            for model in MODELS:
                for storage, order, limited in CONTENDERS:
                    runs.append(run_job(cgroup, data, storage, Path(tmp), order, limited == "limited", model=model))
                    print(f"memory_limit rep {rep + 1} {model} {storage} {order} {limited}: {runs[-1]}", flush=True)
    block_mb = int(FACTOR * LIMIT_MB * 2**20 / ROW_BYTES) * ROW_BYTES / 2**20
    payload = {"limit_mb": LIMIT_MB, "block_mb": block_mb, "repetitions": REPETITIONS, "read_ceiling_mib_s": ceiling,
               "decode_ceiling_rows_s": decoded, "runs": runs,
               "ratios": {m: _ratios([r for r in runs if r.get("model", "logreg") == m]) for m in MODELS}}
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
             "one epoch)", "",
             "`memory` without a limit is the baseline; contenders alternate, for a reading-bound job (logreg) and a "
             "compute-bound one (mlp, hidden [128, 64]). Every run starts with the Parquet file's pages dropped from "
             "the page cache. Memory: the rank's peak RSS (mapped and cached file pages included), its peak "
             "anonymous memory (RssAnon, sampled every 20 ms) and the cgroup's peak (page cache included).", "",
             f"The disk's sequential read ceiling under the limit (one pass over the Parquet file, {READ_MB} MiB "
             "reads, cache dropped): " + ", ".join(f"{v:,.0f}" for v in p["read_ceiling_mib_s"]) + " MiB/s. Decoding "
             "the Parquet file row group by row group on one thread, as `stream`'s reader does (one O_DIRECT "
             "read a row group, pyarrow's decoder, under the limit), the most samples/s a one-worker `stream` run "
             "can reach: "
             + ", ".join(f"{v:,.0f}" for v in p["decode_ceiling_rows_s"]) + " rows/s.", "",
             "| model | block_storage | epoch_order | limit | outcome | seconds | data p50 / p95 | read (overlapped) | "
             "O_DIRECT | peak RSS | peak RssAnon | cgroup peak | limit hits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
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
        direct = {True: "yes", False: "no"}.get((r.get("direct_reads") or [None])[0], "-")
        lines.append(f"| {r.get('model', 'logreg')} | {r['storage']} | {r.get('order', 'global')} | "
                     f"{'yes' if r.get('limited', True) else 'no'} | {outcome} | {r['seconds']:.0f} | {data} | "
                     f"{read} | {direct} | {rss} | {anon} | {cgroup} | {hits} |")
    lines += ["", "Samples/s under the limit over `memory` without one (medians): "
              + "; ".join(f"{m}: " + ", ".join(f"{k} {v:.2f}x" for k, v in r.items()) for m, r in p["ratios"].items())]
    return "\n".join(lines) + "\n"
