"""The demo as a newcomer runs it: `blocksync run --config conf/local.yaml` (what `make demo` runs after
its set-up check), timed from outside, REPEATS times in fresh processes.

Recorded per run: the wall time of the whole command (Python and JVM start, prepare, train, evaluate,
report), the training stage's launch-to-first-step time and its phases (`metrics.json`
`startup_phases`, from a cold Spark session: every run starts its own), and the test accuracy.
The target (issue 17): under 30 s of wall time after set-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median, write

REPEATS = 3
REPO = Path(__file__).resolve().parent.parent


def one_run(out: Path) -> dict:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", "run", "--config", "conf/local.yaml",
                           f"output_dir={out}", "--quiet"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the demo failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_seconds": wall, "test_accuracy": metrics["test_accuracy"],
            "startup_phases": metrics["startup_phases"]}


def run(spark) -> dict:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(REPEATS):
            runs.append(one_run(Path(tmp) / f"run{i}"))
            print(f"run {i + 1}/{REPEATS}: {runs[-1]['wall_seconds']:.1f} s, launch to first step "
                  f"{runs[-1]['startup_phases']['launch_to_first_step_s']:.2f} s", flush=True)
    wall = median([r["wall_seconds"] for r in runs])
    first = median([r["startup_phases"]["launch_to_first_step_s"] for r in runs])
    payload = {"repeats": REPEATS, "runs": runs, "median_wall_seconds": wall, "median_launch_to_first_step_s": first}
    lines = ["# The demo: `blocksync run --config conf/local.yaml`, wall time from outside (fresh process each run)",
             "", "| run | wall time | launch to first step | spawn | imports | load | rendezvous | init | "
             "first step | test accuracy |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(runs):
        p = r["startup_phases"]
        lines.append(f"| {i + 1} | {r['wall_seconds']:.1f} s | {p['launch_to_first_step_s']:.2f} s | "
                     + " | ".join(f"{p[k]:.2f} s" for k in ("spawn_s", "imports_s", "load_s", "rendezvous_s",
                                                              "init_s", "first_step_s"))
                     + f" | {r['test_accuracy']:.4f} |")
    lines += ["", f"Median wall time {wall:.1f} s (target < 30 s); median launch to first step {first:.2f} s."]
    write("demo", payload, "\n".join(lines) + "\n")
    return payload
