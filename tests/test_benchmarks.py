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
        "unknown benchmark(s) nope; available: allreduce, throughput, horovod_profile, compression, peers, memory, "
        "memory_limit, scoring, accuracy, demo, netcluster, scaling")


def test_scaling_model_is_the_ring_floor_plus_latency():
    # 1 GB over 10 Gbit/s (1.25 GB/s) between 2 workers: 2 * 1/2 * 1e9 / 1.25e9 = 0.8 s on the wire.
    assert allreduce_seconds(2, 1e9, 10) == pytest.approx(0.8 + 2 * ALPHA_S + CYCLE_S)
    # The bandwidth term tends to 2 S / B as N grows; the latency term grows linearly.
    assert allreduce_seconds(64, 1e9, 100) == pytest.approx(2 * 63 / 64 * 0.08 + 126 * ALPHA_S + CYCLE_S)


def test_scaling_model_refitted_to_shaped_links():
    # a = 1.5 x the floor plus 2 ms per hop: 2 workers, 1 GB at 10 Gbit/s is 1.5 x 0.8 s + 2 x 2 ms.
    fit = {"bandwidth_factor": 1.5, "hop_seconds": 0.002}
    assert allreduce_seconds(2, 1e9, 10, fit) == pytest.approx(1.2 + 0.004)


def test_the_ring_fit_recovers_a_known_line():
    from benchmarks.netcluster import fit_allreduce

    rows = [{"floor_seconds": f, "seconds": 1.25 * f + 0.003} for f in (0.01, 0.1, 0.4, 1.6)]
    fit = fit_allreduce(rows)
    assert fit["bandwidth_factor"] == pytest.approx(1.25) and fit["fixed_seconds"] == pytest.approx(0.003)
