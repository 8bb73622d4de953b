"""The demo as a newcomer runs it: `blocksync run --config conf/local.yaml` (what `make demo` runs after
its set-up check), timed from outside, REPEATS times in fresh processes, each followed by one without the
class archive and one with `train.balance=speed` (the probe stage's cost, `startup_phases.probe_s`;
the target, issue 34: under 2 s; and what it adds before the first step: the probe stage plus that run's
launch to first step, against the plain runs' launch to first step).

Recorded per run: the wall time of the whole command (Python and JVM start, prepare, train, evaluate,
report), the training stage's launch-to-first-step time and its phases (`metrics.json`
`startup_phases`, from a cold Spark session: every run starts its own), and the test accuracy.
The target (issue 17): under 30 s of wall time after set-up.

Each run alternates with one whose JVM starts without the class archive `make setup` records
(`session.class_archive_option`; `spark.driver.defaultJavaOptions=-Xshare:auto`, the JVM's own
default): the archive's share of the wall time. Then two more of the CLI's start-up measures, each
against what it replaced, in fresh processes (`benchmarks.startup_probe`), the contenders alternating
PART_REPEATS times: the stages' imports overlapping the JVM's start (`cli.session_with_preload`)
against importing first, and the exit after `gc.freeze()` (`cli.console`) against a plain exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import SettingError, median, write

REPEATS = 3
PART_REPEATS = 5
PAIRS = (("sequential", "overlapped"), ("exit_collected", "exit_frozen"))
REPO = Path(__file__).resolve().parent.parent
WITHOUT_ARCHIVE = ["spark.conf.spark.driver.defaultJavaOptions=-Xshare:auto"]


def check() -> None:
    from blocksync.pipeline.session import JVM_ARCHIVE, class_archive_option

    if not class_archive_option():  # what local sessions start with, size check included
        raise SettingError(f"demo: local sessions would start without the JVM class archive {JVM_ARCHIVE}, so "
                           "the demo would not run as `make demo` does; record it with `make setup` (or python "
                           "-m blocksync.pipeline.jvm_archive).")


def one_run(out: Path, overrides: list[str] | None = None) -> dict:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", "run", "--config", "conf/local.yaml",
                           f"output_dir={out}", "--quiet", *(overrides or [])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the demo failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_seconds": wall, "test_accuracy": metrics["test_accuracy"],
            "startup_phases": metrics["startup_phases"]}


def probe(mode: str) -> dict:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.startup_probe", mode], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"startup_probe {mode} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    printed = proc.stdout.split()
    return {"wall_seconds": wall, **({"session_up_seconds": float(printed[-1])} if printed else {})}


def start_up_parts() -> dict:
    """Each mode's runs and medians; the two of a pair run one after the other, PART_REPEATS times."""
    runs: dict[str, list[dict]] = {mode: [] for pair in PAIRS for mode in pair}
    for _ in range(PART_REPEATS):
        for pair in PAIRS:
            for mode in pair:
                runs[mode].append(probe(mode))
    parts = {}
    for mode, rows in runs.items():
        parts[mode] = {"runs": rows, "median_wall_seconds": median([r["wall_seconds"] for r in rows])}
        if "session_up_seconds" in rows[0]:
            parts[mode]["median_session_up_seconds"] = median([r["session_up_seconds"] for r in rows])
    return parts


def parts_lines(parts: dict) -> list[str]:
    up = {m: parts[m]["median_session_up_seconds"] for m in PAIRS[0]}
    out = {m: parts[m]["median_wall_seconds"] for m in PAIRS[1]}
    return ["", f"Start-up parts (medians of {PART_REPEATS} alternating fresh processes each, "
            "`benchmarks/startup_probe.py`):", "",
            "| measure | before | with it | saved |", "| --- | --- | --- | --- |",
            f"| process start to Spark session up and the run's modules imported: imports first, then the "
            f"session / imports on a thread while the JVM starts | {up['sequential']:.2f} s | "
            f"{up['overlapped']:.2f} s | {up['sequential'] - up['overlapped']:.2f} s |",
            f"| a process that imports the run's modules and exits: plain exit / `gc.freeze()` first | "
            f"{out['exit_collected']:.2f} s | {out['exit_frozen']:.2f} s | "
            f"{out['exit_collected'] - out['exit_frozen']:.2f} s |"]


def run(spark) -> dict:
    runs, plain, speed = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(REPEATS):
            runs.append(one_run(Path(tmp) / f"run{i}"))
            plain.append(one_run(Path(tmp) / f"plain{i}", WITHOUT_ARCHIVE))
            speed.append(one_run(Path(tmp) / f"speed{i}", ["train.balance=speed"]))
            print(f"run {i + 1}/{REPEATS}: {runs[-1]['wall_seconds']:.1f} s (without the class archive "
                  f"{plain[-1]['wall_seconds']:.1f} s), launch to first step "
                  f"{runs[-1]['startup_phases']['launch_to_first_step_s']:.2f} s", flush=True)
    wall = median([r["wall_seconds"] for r in runs])
    plain_wall = median([r["wall_seconds"] for r in plain])
    first = median([r["startup_phases"]["launch_to_first_step_s"] for r in runs])
    probe = median([r["startup_phases"]["probe_s"] for r in speed])
    probe_start = median([r["startup_phases"]["probe_start_s"] for r in speed])
    # What the probe adds before the first step: the probe stage and the training stage's own start (which reuses
    # the probe's Python workers), against the plain runs' start.
    added = median([r["startup_phases"]["probe_s"] + r["startup_phases"]["launch_to_first_step_s"] for r in speed]) \
        - first
    parts = start_up_parts()
    payload = {"repeats": REPEATS, "runs": runs, "median_wall_seconds": wall, "median_launch_to_first_step_s": first,
               "runs_without_class_archive": plain, "median_wall_seconds_without_class_archive": plain_wall,
               "runs_balance_speed": speed, "median_probe_s": probe, "median_probe_start_s": probe_start,
               "probe_added_to_first_step_s": added, "start_up_parts": parts}
    lines = ["# The demo: `blocksync run --config conf/local.yaml`, wall time from outside (fresh process each run)",
             "", "| run | wall time | launch to first step | spawn | imports | load | rendezvous | init | "
             "first step | test accuracy | wall time without the class archive (next run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, (r, q) in enumerate(zip(runs, plain, strict=True)):
        p = r["startup_phases"]
        lines.append(f"| {i + 1} | {r['wall_seconds']:.1f} s | {p['launch_to_first_step_s']:.2f} s | "
                     + " | ".join(f"{p[k]:.2f} s" for k in ("spawn_s", "imports_s", "load_s", "rendezvous_s",
                                                              "init_s", "first_step_s"))
                     + f" | {r['test_accuracy']:.4f} | {q['wall_seconds']:.1f} s |")
    lines += ["", f"Median wall time {wall:.1f} s (target < 30 s); median launch to first step {first:.2f} s. "
              f"Without the JVM class archive: median {plain_wall:.1f} s ({plain_wall - wall:.1f} s more)."]
    each = ", ".join(f"{r['startup_phases']['probe_s']:.2f}" for r in speed)
    training = median([r["startup_phases"]["launch_to_first_step_s"] for r in speed])
    lines += ["", f"With `train.balance=speed` (each run's third, same config): the probe stage "
              f"(`startup_phases.probe_s`) took {each} s, median {probe:.2f} s (target < 2 s), of which "
              f"{probe_start:.2f} s until its last task started (`probe_start_s`: mostly the Python workers' start, "
              f"which the training stage then reuses); the training stage's launch to first step took {training:.2f} s "
              f"against {first:.2f} s without the probe, so the probe added {added:.2f} s before the first step "
              f"(medians); wall time median {median([r['wall_seconds'] for r in speed]):.1f} s.",
              "", "| run with balance=speed | probe stage | of it until its last task started | launch to first step "
              "| spawn | imports | load |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(speed):
        p = r["startup_phases"]
        lines.append(f"| {i + 1} | {p['probe_s']:.2f} s | {p['probe_start_s']:.2f} s | "
                     f"{p['launch_to_first_step_s']:.2f} s | {p['spawn_s']:.2f} s | {p['imports_s']:.2f} s | "
                     f"{p['load_s']:.2f} s |")
    lines += parts_lines(parts)
    write("demo", payload, "\n".join(lines) + "\n")
    return payload
