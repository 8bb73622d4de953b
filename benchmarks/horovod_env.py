"""Horovod's background thread against torch_gloo in training: which Horovod setting, if any, closes the gap.

The throughput benchmark's job at 2 workers (mlp [256, 256], global batch 4,096, one thread per worker),
torch_gloo against horovod, alternating, REPETITIONS rounds, once per VARIANTS entry. A variant is a
set of environment variables Horovod reads at hvd.init; the executors' Python workers inherit the
environment of the JVM, so each variant runs in its own child process with its own Spark session
(`python -m benchmarks.horovod_env --child NAME`), torch_gloo measured again in each as the baseline.

Per variant: the steady step period (median, as in `throughput`), rank 0's compute p50 and sync p50,
horovod's samples/s over torch_gloo's from the same child, and where the workers' CPU went: the CPU
seconds of the Python workers' main threads (the training loop) and of all their other threads
(Horovod's background thread, Gloo's threads), read from /proc by `ThreadCpu` every 0.2 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import median, write

REPO = Path(__file__).resolve().parent.parent
WORKERS = 2
REPETITIONS = 3
VARIANTS: dict[str, dict[str, str]] = {
    "default (cycle 1 ms)": {},
    "HOROVOD_THREAD_AFFINITY=0,1": {"HOROVOD_THREAD_AFFINITY": "0,1"},
    "HOROVOD_CACHE_CAPACITY=0": {"HOROVOD_CACHE_CAPACITY": "0"},
    "HOROVOD_STALL_CHECK_DISABLE=1": {"HOROVOD_STALL_CHECK_DISABLE": "1"},
}


class ThreadCpu:
    """CPU seconds of every PySpark worker process's threads while it runs: main threads and the rest."""

    def __init__(self) -> None:
        import threading

        self.first: dict[tuple[int, int], float] = {}
        self.last: dict[tuple[int, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        import psutil

        for proc in psutil.process_iter(["cmdline"]):
            try:
                # Python workers are forked from `python -m blocksync.daemon` (or pyspark's own daemon).
                if not {"blocksync.daemon", "pyspark.daemon"} & set(proc.info["cmdline"] or []):
                    continue
                for t in proc.threads():
                    key = (proc.pid, t.id)
                    self.first.setdefault(key, t.user_time + t.system_time)
                    self.last[key] = t.user_time + t.system_time
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def __enter__(self) -> ThreadCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        main = sum(self.last[k] - self.first[k] for k in self.last if k[0] == k[1])
        other = sum(self.last[k] - self.first[k] for k in self.last if k[0] != k[1])
        return {"main_cpu_s": main, "other_threads_cpu_s": other}


def child() -> dict:
    from benchmarks.common import cached_blocks, steady_step_seconds
    from benchmarks.data import synthetic
    from benchmarks.throughput import WARMUP, config
    from blocksync import train_blocks
    from blocksync.pipeline.session import local_session

    spark = local_session("local[4]", "blocksync-bench", {"spark.driver.memory": "4g",
                                                          "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        blocks, info = cached_blocks(spark, synthetic().train_files, WORKERS)
        samples: dict[str, list[dict]] = {"torch_gloo": [], "horovod": []}
        for _ in range(REPETITIONS):
            for backend in samples:  # alternating
                with ThreadCpu() as cpu:
                    result = train_blocks(spark, blocks, info, config(WORKERS, backend))
                timing = result.metrics["timing"]["0"]
                samples[backend].append({"step_ms": 1e3 * steady_step_seconds(result, WARMUP),
                                         "compute_p50_ms": timing["compute_p50_ms"],
                                         "sync_p50_ms": timing["sync_p50_ms"], **cpu.seconds()})
        return {b: {k: median([o[k] for o in outs]) for k in outs[0]} for b, outs in samples.items()}
    finally:
        spark.stop()


def run(spark) -> dict:
    rows = []
    for name, env in VARIANTS.items():
        proc = subprocess.run([sys.executable, "-m", "benchmarks.horovod_env", "--child", name], cwd=REPO,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"variant {name!r} failed: {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        row = {"variant": name, "torch_gloo": out["torch_gloo"], "horovod": out["horovod"],
               "horovod_over_torch_gloo": out["torch_gloo"]["step_ms"] / out["horovod"]["step_ms"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = [f"# Horovod settings against torch_gloo in training ({WORKERS} workers, medians of {REPETITIONS})", "",
             "| variant | torch_gloo step | horovod step | horovod / torch_gloo samples/s | compute p50 (gloo, hvd) "
             "| sync p50 (gloo, hvd) | workers' CPU s, main threads (gloo, hvd) | other threads (gloo, hvd) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        g, h = r["torch_gloo"], r["horovod"]
        lines.append(f"| {r['variant']} | {g['step_ms']:.1f} ms | {h['step_ms']:.1f} ms | "
                     f"{r['horovod_over_torch_gloo']:.2f} | {g['compute_p50_ms']:.1f}, {h['compute_p50_ms']:.1f} ms | "
                     f"{g['sync_p50_ms']:.1f}, {h['sync_p50_ms']:.1f} ms | {g['main_cpu_s']:.1f}, "
                     f"{h['main_cpu_s']:.1f} | {g['other_threads_cpu_s']:.1f}, {h['other_threads_cpu_s']:.1f} |")
    payload = {"rows": rows, "workers": WORKERS, "repetitions": REPETITIONS}
    write("horovod_env", payload, "\n".join(lines) + "\n")
    return payload


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child()), flush=True)
