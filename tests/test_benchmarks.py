"""The benchmark harness: its command line and the scaling model's arithmetic (timings live in benchmarks/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmarks.scaling import ALPHA_S, CYCLE_S, allreduce_seconds

REPO = Path(__file__).resolve().parents[1]


def test_bench_refuses_an_unknown_benchmark_before_starting_spark():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "allreduce", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "unknown benchmark(s) nope; available: allreduce, throughput, horovod_profile, horovod_env, compression, "
        "peers, bigmodel, bigmodel_transformer, memory, memory_limit, epoch_order, scoring, model_selection, accuracy, "
        "balance, demo, netcluster, scaling, sharding, sharding_limit")


def test_bench_refuses_a_setting_a_benchmark_cannot_use_before_starting_spark(monkeypatch, capsys):
    import benchmarks.__main__ as bench
    import benchmarks.model_selection as model_selection

    from blocksync.engine.config import TrainConfig

    # conf/local.yaml as if its lr were outside the grid; model_selection's own check refuses it.
    monkeypatch.setattr(model_selection, "_config", lambda: type("Run", (), {"train": TrainConfig(lr=0.003)})())
    monkeypatch.setattr("blocksync.pipeline.session.local_session", lambda *a, **k: pytest.fail("Spark started"))
    assert bench.main(["model_selection"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("benchmarks: conf/local.yaml's lr=0.003, weight_decay=0, schedule=constant, "
                              "label_smoothing=0 and hidden=[128, 64] are not a point of")


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


def test_model_selection_adopts_only_a_gain_beyond_two_standard_errors():
    import numpy as np
    from benchmarks.model_selection import decide

    default = [0.90, 0.92, 0.94, 0.96]
    both = np.array([True, True])
    # The same +0.03 on every fold: no spread, so any gain is beyond two standard errors.
    steady = np.array([default, [0.93, 0.95, 0.97, 0.99]])
    chosen, gain, two_se = decide(steady, both)
    assert chosen == 1 and gain == pytest.approx(0.03) and two_se == pytest.approx(0.0, abs=1e-12)
    # +0.05, -0.03, +0.05, -0.03: mean +0.01; sample std 0.04 * sqrt(4 / 3), so two standard errors are
    # 2 * 0.0462 / 2 = 0.0462 > 0.01: the default stays.
    noisy = np.array([default, [0.95, 0.89, 0.99, 0.93]])
    chosen, gain, two_se = decide(noisy, both)
    assert chosen == 0 and gain == pytest.approx(0.01) and two_se == pytest.approx(0.04 * (4 / 3) ** 0.5)
    # A tie for the best mean (exact in binary) goes to the first in grid order: the steady one, adopted;
    # the second, with its spread, would not be.
    three = np.array([True, True, True])
    assert decide(np.array([[0.5] * 4, [0.75] * 4, [1.0, 0.5, 1.0, 0.5]]), three)[0] == 1
    assert decide(np.array([[0.5] * 4, [1.0, 0.5, 1.0, 0.5], [0.75] * 4]), three)[0] == 0
    # A setting that is not a candidate (a wider network) is never chosen, however it scores.
    assert decide(np.array([[0.5] * 4, [0.75] * 4, [1.0] * 4]), np.array([True, True, False]))[:2] == (1, 0.25)
    assert decide(np.array([[0.5] * 4, [1.0] * 4]), np.array([True, False])) == (0, 0.0, 0.0)
    # The default itself best: nothing to adopt.
    assert decide(np.array([[0.99] * 4, [0.93, 0.95, 0.97, 0.99]]), both) == (0, 0.0, 0.0)


def test_model_selection_grid_holds_the_default_first():
    from benchmarks.model_selection import GRID, settings

    from blocksync.engine.config import ModelSpec, TrainConfig

    base = TrainConfig(lr=0.002, weight_decay=1e-4, schedule="cosine", label_smoothing=0.1,
                       model=ModelSpec(hidden=[256, 128]))
    points = settings(base)
    assert len(points) == int(np.prod([len(values) for values in GRID.values()])) == 72
    assert points[0][0] == "lr=0.002 weight_decay=0.0001 schedule=cosine label_smoothing=0.1 hidden=[256, 128]"
    assert points[0][1].label_smoothing == 0.1 and points[0][1].model.hidden == [256, 128]
    assert len({label for label, _ in points}) == len(points)
    with pytest.raises(ValueError, match=r"lr=0.003, weight_decay=0, schedule=constant, label_smoothing=0 and "
                       r"hidden=\[128, 64\] are not a point of benchmarks/model_selection.py's GRID; add its values"):
        settings(TrainConfig(lr=0.003))
