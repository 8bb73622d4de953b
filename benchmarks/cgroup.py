"""A child cgroup v1 memory controller for a benchmark's Spark job, and one job run inside it.

`child_cgroup` makes the cgroup under this process's own and, on the way out, kills whatever is left
in it and removes it. `run_job` runs a benchmark job script with Spark's Python daemon joining the
cgroup (`cgroup_daemon.py`) and reads the cgroup's peak usage and limit hits after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def child_cgroup(parent: Path, prefix: str, limit_mb: int | None = None) -> Iterator[Path]:
    """`parent`/`prefix`-<pid>, with `limit_mb` (None: no limit) as its memory limit; on exit, any process
    still in it (Spark's daemon exits with its JVM: what remains is ours) is killed and it is removed."""
    cgroup = parent / f"{prefix}-{os.getpid()}"
    cgroup.mkdir()
    try:
        set_limit(cgroup, limit_mb)
        yield cgroup
    finally:
        empty_and_remove(cgroup)


def set_limit(cgroup: Path, limit_mb: int | None) -> None:
    (cgroup / "memory.limit_in_bytes").write_text("-1" if limit_mb is None else str(limit_mb * 2**20))


def run_job(cgroup: Path, script: str, args: list[str], out: Path, limited: bool = True) -> dict:
    """Run benchmarks/`script` with `args` and the result file `out` (argv: args[0], out, args[1:]) with Spark's
    Python workers in `cgroup`; returns the JSON it wrote, with the cgroup's peak and limit hits when `limited`."""
    (cgroup / "memory.max_usage_in_bytes").write_text("0")  # reset the peak
    failcnt_before = int((cgroup / "memory.failcnt").read_text())
    env = {**os.environ, "BLOCKSYNC_BENCH_CGROUP": str(cgroup), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), args[0], str(out), *args[1:]],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{script} {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    report = json.loads(out.read_text())
    if limited:
        report["cgroup_peak_mb"] = int((cgroup / "memory.max_usage_in_bytes").read_text()) / 2**20
        report["cgroup_limit_hits"] = int((cgroup / "memory.failcnt").read_text()) - failcnt_before
    return report


def empty_and_remove(cgroup: Path) -> None:
    """Kill every process left in `cgroup` (one of ours: what our job started), then remove the group.
    For any cgroup v1 controller (the balance benchmark's cpu groups too)."""
    for _ in range(100):
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    cgroup.rmdir()
