"""balance=speed: blocks sized by each rank's measured speed, and faults.slow_factor, the straggler it balances."""

from __future__ import annotations

import time

import numpy as np
import pytest

from blocksync import ModelSpec, TrainConfig, train, train_files
from blocksync.engine import checkpoint
from blocksync.engine.balance import (
    balanced_speeds,
    check_shares,
    shared_fixed_seconds,
    step_fixed_seconds,
    weighted_sizes,
    within_tolerance,
)
from blocksync.engine.driver import balancing
from blocksync.engine.driver.balancing import Balance, placement
from blocksync.engine.driver.blocks import make_blocks
from blocksync.engine.driver.launcher import train_blocks
from blocksync.engine.plan import ShardPlan, WorkerPlan
from blocksync.engine.worker.placement import block_of_rank
from blocksync.engine.worker.probe import probe_costs
from blocksync.engine.worker.trainer import straggle
from tests.conftest import synthetic_classification
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train
from tests.test_shards import data, expected_blocks  # noqa: F401 (the module fixture `data`)

pytestmark = pytest.mark.timeout(400)


def rule_sizes(total: int, speeds: list[float]) -> list[int]:
    """The README's rule, written again here: floor of the proportional share, then the leftover rows one
    each by largest remainder (ties: lower rank)."""
    shares = [total * s / sum(speeds) for s in speeds]
    sizes = [int(np.floor(v)) for v in shares]
    order = sorted(range(len(speeds)), key=lambda r: (sizes[r] - shares[r], r))
    for r in order[: total - sum(sizes)]:
        sizes[r] += 1
    return sizes


def rule_rates(batch: int, probe_rows: int, speeds: list[float], fixed: list[float]) -> list[float]:
    """The README's balanced rule, solved another way: a step of b rows on rank r takes fixed[r] + b * c[r]
    seconds (c[r] from its time at `probe_rows`); find by bisection the step time T at which the local batches
    (T - fixed[r]) / c[r] sum to `batch`, and return each rank's rows per second at it. No fixed costs: the
    measured speeds as they are."""
    if not any(fixed):
        return speeds
    per_row = [(probe_rows / s - f) / probe_rows for s, f in zip(speeds, fixed, strict=True)]
    lo, hi = 0.0, max(fixed) + batch * max(per_row)
    for _ in range(200):
        mid = (lo + hi) / 2
        rows = sum(max(mid - f, 0.0) / c for f, c in zip(fixed, per_row, strict=True))
        lo, hi = (mid, hi) if rows < batch else (lo, mid)
    return [max(lo - f, 0.0) / c / lo for f, c in zip(fixed, per_row, strict=True)]


def rule_cut_rates(batch: int, probe_rows: int, speeds: list[float], fixed: list[float]) -> list[float]:
    """`rule_rates` on the fixed costs the README's rule shares out: the fastest rank's fixed fraction of its
    step (ties: the lower rank), times each rank's own step at `probe_rows` rows."""
    fastest = sorted(range(len(speeds)), key=lambda r: (-speeds[r], r))[0]
    fraction = fixed[fastest] / (probe_rows / speeds[fastest])
    return rule_rates(batch, probe_rows, speeds, [fraction * probe_rows / s for s in speeds])


def test_every_rank_takes_the_fastest_ranks_fixed_fraction():
    # The fastest rank (rank 1) spends 20% of its 10 ms step on fixed work; the others are charged 20% of theirs.
    fixed = shared_fixed_seconds(1000, [50_000.0, 100_000.0, 25_000.0], [0.01, 0.002, 0.0])
    assert fixed == pytest.approx([0.004, 0.002, 0.008])
    assert shared_fixed_seconds(1000, [100_000.0, 100_000.0], [0.003, 0.001]) == pytest.approx([0.003, 0.003])


def test_the_fixed_part_of_a_step_is_the_intercept_of_two_sizes():
    step = lambda rows: 0.002 + rows * 1e-5  # noqa: E731
    assert step_fixed_seconds(1024, step(1024), 512, step(512)) == pytest.approx(0.002)
    assert step_fixed_seconds(1024, 0.010, 512, 0.005) == pytest.approx(0.0)  # proportional: no fixed part
    # Noise: the larger batch no faster, or a line through negative time, leaves the cut proportional.
    assert step_fixed_seconds(1024, 0.004, 512, 0.005) == 0.0
    assert step_fixed_seconds(1024, 0.012, 512, 0.005) == 0.0
    assert step_fixed_seconds(1, 0.001, 1, 0.001) == 0.0  # a batch of one row has no half


def test_balanced_speeds_equalize_the_predicted_step_times():
    assert balanced_speeds(4096, 1024, [10.0, 20.0], [0.0, 0.0]) == [10.0, 20.0]  # exactly the proportional rule
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(2, 7))
        speeds = list(rng.uniform(1_000, 50_000, size=n))
        probe_rows = int(rng.integers(16, 2048))
        fixed = [float(rng.uniform(0, 0.3)) * probe_rows / s for s in speeds]  # up to 30% of the probed step
        batch = probe_rows * n
        rates = balanced_speeds(batch, probe_rows, speeds, fixed)
        assert rates == pytest.approx(rule_rates(batch, probe_rows, speeds, fixed), rel=1e-9, abs=1e-6)
        rows = [batch * r / sum(rates) for r in rates]
        times = [f + b * (probe_rows / s - f) / probe_rows for f, b, s in zip(fixed, rows, speeds, strict=True)
                 if b > 1e-6]  # a rank whose fixed cost alone is over the step gets no rows (check_shares refuses)
        assert max(times) == pytest.approx(min(times), rel=1e-9)
    # Half the speed and a fixed cost: less than the proportional share (0.5 / 1.5) of the rows.
    slow, fast = balanced_speeds(2048, 1024, [5_000.0, 10_000.0], [0.02, 0.01])
    assert slow / (slow + fast) < 0.5 / 1.5


def test_the_probe_measures_a_rate_and_a_fixed_part_per_rank():
    config = cfg(faults={"slow_rank": 1, "slow_factor": 3.0})
    fast_rate, fast_fixed = probe_costs(config, 10, 3, None, 64, rank=0)
    slow_rate, slow_fixed = probe_costs(config, 10, 3, None, 64, rank=1)
    assert slow_rate < 0.75 * fast_rate  # the 3x slower rank measured slower
    for rate, fixed in ((fast_rate, fast_fixed), (slow_rate, slow_fixed)):
        assert 0.0 <= fixed < 64 / rate  # a part of the step at 64 rows, never all of it


def test_weighted_sizes_follow_the_documented_rule():
    assert weighted_sizes(10, [1.0, 1.0, 2.0]) == [3, 2, 5]
    assert weighted_sizes(203, [100.0, 50.0, 100.0]) == [81, 41, 81]
    rng = np.random.default_rng(0)
    for _ in range(50):
        speeds = list(rng.uniform(1, 100, size=int(rng.integers(1, 7))))
        total = int(rng.integers(len(speeds), 5000))
        assert weighted_sizes(total, speeds) == rule_sizes(total, speeds)
        assert sum(weighted_sizes(total, speeds)) == total


def test_a_rank_under_one_row_per_step_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"balance=speed: rank 2 \(on hostB\) measured 1 rows/s against the fastest "
                                         r"rank's 1000, so its share is 0 rows for 7 steps per epoch.*lower "
                                         r"num_workers, exclude that executor.*or set balance=even"):
        check_shares([100, 100, 0], 7, [1000.0, 1000.0, 1.0], ["hostA", "hostA", "hostB"])
    check_shares([7, 7], 7, [1.0, 1.0], ["a", "b"])  # one row per step is enough


def test_a_probe_that_starves_a_rank_is_taken_again_before_refusing(monkeypatch):
    config = cfg(batch_size=2048)
    starving = dict(speeds=[60_000.0, 20.0], fixed_seconds=[0.004, 0.05], hosts=["a", "b"], probe_seconds=1.0)
    fine = dict(speeds=[60_000.0, 30_000.0], fixed_seconds=[0.004, 0.008], hosts=["a", "b"], probe_seconds=1.5)
    for second, refused in ((fine, False), (starving, True)):
        probes = iter([Balance(**starving), Balance(**second)])
        monkeypatch.setattr(balancing, "measure", lambda *args: next(probes))  # noqa: B023
        chosen: list[Balance] = []
        cut = balancing.cutter(None, config, lambda labels: 2, chosen)
        if refused:
            with pytest.raises(ValueError, match=r"rank 1 \(on b\) measured 20 rows/s against the fastest"):
                cut(8, (0.0, 1.0, 2), None, 8192)
            continue
        sizes = cut(8, (0.0, 1.0, 2), None, 8192)
        assert sizes == rule_sizes(8192, rule_cut_rates(2048, 1024, fine["speeds"], fine["fixed_seconds"]))
        assert chosen[0].probes == 2 and chosen[0].probe_seconds == 2.5 and chosen[0].speeds == fine["speeds"]
        assert chosen[0].rule == "step times"


def test_steps_of_mostly_fixed_cost_are_cut_in_proportion(monkeypatch):
    # At 16 rows a rank the fastest rank's step is 90% fixed cost: predicted step times would give the 3x slower
    # rank under one row a step, for no gain (its fixed cost is paid anyway), so the cut is the proportional one.
    measured = dict(speeds=[9_000.0, 3_000.0], fixed_seconds=[0.0016, 0.005], hosts=["a", "b"])
    monkeypatch.setattr(balancing, "measure", lambda *args: Balance(**measured))
    chosen: list[Balance] = []
    sizes = balancing.cutter(None, cfg(), lambda labels: 3, chosen)(10, (0.0, 2.0, 3), None, 203)
    assert min(rule_sizes(203, rule_cut_rates(32, 16, measured["speeds"], measured["fixed_seconds"]))) < 7
    assert sizes == rule_sizes(203, measured["speeds"]) and chosen[0].rule == "proportional"


def test_slow_factor_is_validated_and_stretches_compute():
    with pytest.raises(ValueError, match=r"faults.slow_factor=0.5 must be >= 1 \(2: the rank computes at half"):
        TrainConfig(faults={"slow_rank": 0, "slow_factor": 0.5})
    with pytest.raises(ValueError, match=r"faults.slow_factor and faults.slow_ms slow down faults.slow_rank, which "
                                         r"is unset"):
        TrainConfig(faults={"slow_factor": 2.0})
    with pytest.raises(ValueError, match=r"faults.slow_rank=3 but num_workers=2"):
        TrainConfig(num_workers=2, faults={"slow_rank": 3, "slow_factor": 2.0})
    with pytest.raises(ValueError, match=r"balance='fast' is not one of even, speed"):
        TrainConfig(balance="fast")
    started = time.perf_counter()
    straggle(0.05, 3.0, 0.01)  # (3 - 1) x 50 ms + 10 ms
    assert time.perf_counter() - started >= 0.11
    started = time.perf_counter()
    straggle(0.05, 1.0, 0.0)
    assert time.perf_counter() - started < 0.05


def test_speeds_within_ten_percent_are_equal_machines():
    assert within_tolerance([1000.0, 901.0]) and within_tolerance([500.0, 500.0, 480.0, 520.0])
    assert not within_tolerance([1000.0, 899.0]) and not within_tolerance([1000.0, 500.0])


def test_each_rank_reads_the_block_cut_for_its_executor(tmp_path):
    shards = ShardPlan(filesystem=None, features=["f"], label="y", pieces=[[], [], []])  # type: ignore[arg-type]
    balance = {"speeds": [1.0, 2.0, 3.0], "hosts": ["h"] * 3, "executors": ["a:1", "b:1", "c:1"], "cut": "speed"}
    plan = WorkerPlan(config=TrainConfig(num_workers=3), num_features=1, num_outputs=2, total_rows=9,
                      steps_per_epoch=1, shards=shards, balance=balance)
    # Spark placed training's tasks on the probe's executors in another order: each rank follows its executor.
    assert block_of_rank(plan, ["c:1", "a:1", "b:1"]) == [2, 0, 1]
    assert placement(balance, [2, 0, 1], ["c:1", "a:1", "b:1"]) == []
    assert block_of_rank(plan, ["a:1", "a:1", "a:1"]) == [0, 1, 2]  # other executors than the probe's: ids kept
    assert placement(balance, [0, 1, 2], ["b:1", "a:1", "c:1"]) == [0, 1]  # shuffle cannot follow: named
    two_slots = {**balance, "executors": ["a:1", "b:1", "a:1"]}  # an executor of two slots shares its blocks
    assert block_of_rank(WorkerPlan(**{**plan.__dict__, "balance": two_slots}), ["b:1", "a:1", "a:1"]) == [1, 0, 2]
    for unchanged in ({**balance, "cut": "even"}, None):  # an even cut, or balance=even: the identity
        assert block_of_rank(WorkerPlan(**{**plan.__dict__, "balance": unchanged}), ["c:1", "a:1", "b:1"]) == [0, 1, 2]
    assert placement({**balance, "executors": ["driver"] * 3}, [0, 1, 2], ["x", "y", "z"]) == []  # local mode
    # A relaunch keeps the assignment saved with the checkpoint it resumes, wherever Spark places it now.
    saved = tmp_path / "step-000000004"
    saved.mkdir()
    (saved / checkpoint.MANIFEST).write_text('{"balance": {"block_of_rank": [1, 2, 0]}}')
    resumed = WorkerPlan(**{**plan.__dict__, "resume_from": str(saved)})
    assert block_of_rank(resumed, ["a:1", "b:1", "c:1"]) == [1, 2, 0]


def cfg(**extra) -> TrainConfig:
    # Two ranks on the 2 cores: with a third, the ranks that compute hold both cores while the slow one
    # sleeps, and every wake-up waits for a time slice, so the probe measured it up to 56x slower, not 3x.
    settings = dict(num_workers=2, backend="torch_gloo", epochs=2, batch_size=32, seed=3, check_every=5,
                    optimizer="adam", lr=0.01, model=ModelSpec(name="mlp", hidden=[64, 64]), balance="speed",
                    faults={"slow_rank": 1, "slow_factor": 3.0})
    return TrainConfig(**{**settings, **extra})


MEASURED = {"speeds": [3000.0, 1000.0], "fixed_seconds": [0.0005, 0.0015]}
"""What the tests on the 203-row files take as measured. With their 16 rows a rank a step is nearly all fixed
cost (the probe measures about 0.9 of it on this model), so a 3x slower rank's fixed cost alone would be over
the balanced step, and the cut would refuse it (`check_shares`): the real probe is tested on larger batches."""


def measured_speeds(monkeypatch) -> list[int]:
    """Make `balancing.measure` return MEASURED (a new Balance each call: the cut writes into it); the sizes
    the documented rules give for the 203 rows at a global batch of 32 (the probe's 16 rows a rank)."""
    monkeypatch.setattr(balancing, "measure", lambda *args: Balance(**MEASURED, hosts=["h", "h"],
                                                                    executors=["driver", "driver"]))
    sizes = rule_sizes(203, rule_cut_rates(32, 16, MEASURED["speeds"], MEASURED["fixed_seconds"]))
    assert sizes != rule_sizes(203, MEASURED["speeds"])  # the fixed costs move the cut off the proportional one
    return sizes


@pytest.mark.parametrize(("storage", "sync"), [("memory", "gradients"), ("disk", "gradients"),
                                               ("memory", "parameters")])
def test_files_cut_by_speed_equal_single_process_training(spark, data, storage, sync, monkeypatch):  # noqa: F811
    root, x, y = data
    sizes = measured_speeds(monkeypatch)
    # SGD with momentum, not Adam: Adam scales each entry's step by 1/sqrt(v), so an entry whose gradient is
    # near zero steps by what rounding decides, and the same steps summed in another order once drifted to
    # 1.3e-5 on one probed cut (CI, 2026-12-07). What this test checks is which rows each step sees.
    config = cfg(block_storage=storage, sync=sync, sync_every=2, optimizer="sgd", momentum=0.9, lr=0.05)
    result = train_files(spark, str(root / "arrays"), config)
    balance = result.metrics["balance"]
    assert balance["probe_rows_per_s"] == MEASURED["speeds"]
    assert balance["probe_fixed_seconds"] == MEASURED["fixed_seconds"] and balance["cut_rule"] == "step times"
    assert result.block_sizes == sizes and sizes[1] < sizes[0]
    assert balance["row_shares"] == pytest.approx([n / 203 for n in sizes])
    assert len(balance["sync_idle_seconds"]) == 2 and len(balance["train_rows_per_s"]) == 2
    reference = reference_train(expected_blocks(x, y, sizes), config, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    # Each step's global batch: the ranks' slices still sum to an epoch of 203 rows over 7 steps, and
    # differ from the even cut's by rounding only (under one row per rank).
    steps = 7
    batch = [sum((s + 1) * n // steps - s * n // steps for n in sizes) for s in range(steps)]
    even = [sum((s + 1) * n // steps - s * n // steps for n in [102, 101]) for s in range(steps)]
    assert sum(batch) == sum(even) == 203 and max(abs(a - b) for a, b in zip(batch, even, strict=True)) < 3


def test_shuffle_blocks_cut_by_weights_and_the_even_cut_unchanged(spark):
    df = spark.createDataFrame(synthetic_classification(300, 6, 3, seed=8))
    even, info = make_blocks(df, label="label", num_workers=3, seed=2)
    weighted, winfo = make_blocks(df, label="label", num_workers=3, seed=2, cut=lambda d, lab, i, n: [150, 50, 100])
    assert info.sizes == [100, 100, 100] and winfo.sizes == [150, 50, 100]
    even_blocks, weighted_blocks = collect_blocks(even, 3), collect_blocks(weighted, 3)
    assert [len(b[1]) for b in weighted_blocks] == [150, 50, 100]
    rows = {tuple(r) for b in even_blocks for r in np.column_stack(b)}
    assert rows == {tuple(r) for b in weighted_blocks for r in np.column_stack(b)}
    config = cfg(num_workers=3, epochs=1, batch_size=40, model=ModelSpec(name="logreg"))
    balance = Balance(speeds=[3.0, 1.0, 2.0], hosts=["h"] * 3, sizes=[150, 50, 100])
    result = train_blocks(spark, weighted, winfo, config, balance=balance)
    reference = reference_train(weighted_blocks, config, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    with pytest.raises(ValueError, match=r"balance=speed sizes the blocks as train or train_files cuts them"):
        train_blocks(spark, weighted, winfo, config)


def test_train_on_a_dataframe_cuts_by_the_probe(spark):
    # Batches of 1,024 rows a rank on an mlp 256-256: most of a step grows with its rows (the probe measures
    # a fixed part of about 0.15 on this machine, 0.2-0.35 on the rank slowed by sleeps), so the 3x slower
    # rank keeps a share.
    df = spark.createDataFrame(synthetic_classification(4096, 64, 3, seed=8))
    result = train(spark, df, cfg(epochs=1, blocks="shuffle", batch_size=2048,
                                  model=ModelSpec(name="mlp", hidden=[256, 256])))
    balance = result.metrics["balance"]
    speeds, fixed = balance["probe_rows_per_s"], balance["probe_fixed_seconds"]
    assert speeds[1] < 0.75 * speeds[0], speeds  # the 3x slower rank measured slower
    assert all(0.0 <= f < 1024 / s for f, s in zip(fixed, speeds, strict=True)), (fixed, speeds)
    assert balance["cut_rule"] == "step times"
    assert result.block_sizes == rule_sizes(4096, rule_cut_rates(2048, 1024, speeds, fixed))
    assert result.block_sizes[1] < result.block_sizes[0]
    phases = result.metrics["startup_phases"]
    assert 0 < phases["probe_start_s"] < phases["probe_s"] < 30
    assert balance["probe_start_seconds"] == phases["probe_start_s"]


def test_a_relaunch_resumes_on_the_saved_cut_bitwise(spark, data, tmp_path, monkeypatch):  # noqa: F811
    root, _, _ = data
    sizes = measured_speeds(monkeypatch)
    config = cfg(epochs=2, checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 4, "keep": 10})
    first = train_files(spark, str(root / "arrays"), config)
    assert first.block_sizes == sizes
    monkeypatch.undo()  # a relaunch that measured again would cut other blocks: it must take the saved speeds
    # Drop the newest checkpoints: the relaunch resumes at step 4 of 14, with rank 1 no longer slow,
    # so a new probe would cut other blocks.
    for step in (8, 12):
        for f in (tmp_path / "ckpt" / f"step-{step:09d}").iterdir():
            f.unlink()
        (tmp_path / "ckpt" / f"step-{step:09d}").rmdir()
    again = train_files(spark, str(root / "arrays"), cfg(epochs=2, faults={}, checkpoint=config.checkpoint))
    assert again.metrics["resumed_at_step"] == 4
    assert again.metrics["balance"]["speeds_from"] == "checkpoint"
    for key in ("probe_rows_per_s", "probe_fixed_seconds"):
        assert again.metrics["balance"][key] == first.metrics["balance"][key]
    assert again.block_sizes == first.block_sizes
    assert max_param_diff(again.model, first.model) == 0.0


def test_speeds_within_tolerance_cut_exactly_as_even(spark, data, monkeypatch):  # noqa: F811
    root, _, _ = data
    measured = Balance(speeds=[1000.0, 940.0], hosts=["h", "h"], executors=["driver", "driver"])
    monkeypatch.setattr(balancing, "measure", lambda *args: measured)  # equal machines up to probe noise
    config = cfg(epochs=1, faults={})
    speed = train_files(spark, str(root / "arrays"), config)
    even = train_files(spark, str(root / "arrays"), cfg(epochs=1, faults={}, balance="even"))
    assert speed.block_sizes == even.block_sizes == [102, 101]
    assert max_param_diff(speed.model, even.model) == 0.0
    balance = speed.metrics["balance"]
    assert balance["cut"] == "even" and balance["cut_reason"] == "speeds within tolerance (10%), cut even"
    assert balance["probe_rows_per_s"] == [1000.0, 940.0]


def test_the_report_labels_each_rank_with_its_share_and_speed():
    from blocksync.pipeline.report import rank_labels

    metrics = {"balance": {"mode": "speed", "row_shares": [0.6, 0.4], "probe_rows_per_s": [3000.0, 2000.0]},
               "peak_rss_mb": [512.0, 500.0], "block_storage": "disk"}
    labels, what = rank_labels([0, 1], metrics)
    assert labels == ["0\n60% rows\n3,000 rows/s\n512 MiB", "1\n40% rows\n2,000 rows/s\n500 MiB"]
    assert what == "its share of the rows and probed speed (balance=speed) and peak RSS (block_storage=disk)"
    assert rank_labels([0, 1], {"balance": {"mode": "even", "row_shares": [0.5, 0.5]}}) == (["0", "1"], "")
    # Rank 0 read block 1 (cut for its executor): its label shows block 1's speed; an even cut says so.
    moved = {"balance": {"mode": "speed", "row_shares": [0.4, 0.6], "probe_rows_per_s": [3000.0, 2000.0],
                         "block_of_rank": [1, 0], "cut": "speed"}}
    assert rank_labels([0, 1], moved)[0] == ["0\n40% rows\n2,000 rows/s", "1\n60% rows\n3,000 rows/s"]
    even_cut = {"balance": {"mode": "speed", "row_shares": [0.5, 0.5], "probe_rows_per_s": [3000.0, 2900.0],
                            "cut": "even"}}
    assert rank_labels([0, 1], even_cut)[1] == ("its share of the rows and probed speed (balance=speed: speeds "
                                                "within tolerance, cut even)")
