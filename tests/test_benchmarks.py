"""The benchmark harness: its command line and the scaling model's arithmetic (timings live in benchmarks/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.scaling import ALPHA_S, CYCLE_S, allreduce_seconds

REPO = Path(__file__).resolve().parents[1]


def test_bench_refuses_an_unknown_benchmark_before_starting_spark():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "allreduce", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "unknown benchmark(s) nope; available: allreduce, throughput, compression, peers, scaling")


def test_scaling_model_is_the_ring_floor_plus_latency():
    # 1 GB over 10 Gbit/s (1.25 GB/s) between 2 workers: 2 * 1/2 * 1e9 / 1.25e9 = 0.8 s on the wire.
    assert allreduce_seconds(2, 1e9, 10) == pytest.approx(0.8 + 2 * ALPHA_S + CYCLE_S)
    # The bandwidth term tends to 2 S / B as N grows; the latency term grows linearly.
    assert allreduce_seconds(64, 1e9, 100) == pytest.approx(2 * 63 / 64 * 0.08 + 126 * ALPHA_S + CYCLE_S)
