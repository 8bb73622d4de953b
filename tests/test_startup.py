"""Start-up phase clocks (`engine.startup`), without Spark."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from blocksync.engine.worker.startup import StartupClock, describe, process_started_at


def test_process_start_is_read_from_the_kernel():
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5); from blocksync.engine.worker."
                          "startup import process_started_at; print(process_started_at())"],
                         capture_output=True, text=True, check=True)
    after = time.time()
    started = float(out.stdout)
    # The child started right after `before`, and at least 0.5 s before it printed.
    assert before - 0.02 <= started <= after - 0.5, (before, started, after)


def test_phases_partition_the_time_from_launch_to_first_step():
    launched = process_started_at() + 0.1  # a launch after this process started: a reused Python worker
    entered = time.time()
    assert entered > launched + 0.1  # pytest's own imports took longer than that
    clock = StartupClock(launched_at=launched, entered_at=entered)
    for name in ("loaded", "connected", "initialized", "first_step"):
        time.sleep(0.01)
        clock.mark(name)
    phases = clock.phases()
    assert phases["spawn_s"] == 0.0  # a reused worker spawns nothing
    assert phases["imports_s"] == pytest.approx(entered - launched, abs=1e-3)
    parts = ["spawn_s", "imports_s", "load_s", "rendezvous_s", "init_s", "first_step_s"]
    assert sum(phases[p] for p in parts) == pytest.approx(phases["launch_to_first_step_s"], abs=1e-3)
    assert all(phases[p] >= 0.01 - 1e-3 for p in parts[2:]), phases
    line = describe({"rank": 2, **phases})
    assert line.startswith(f"launch to first step {phases['launch_to_first_step_s']:.2f} s (rank 2): spawn 0.00 s")
