"""`balance: speed`: block sizes in proportion to each rank's step rate at the local batch it will train with
(`balanced_speeds`, then `weighted_sizes`), unless the measured speeds are within `SPEED_TOLERANCE` of each other
(`within_tolerance`): then the cut is `even`'s.

A step's time is not proportional to its rows: the optimizer's update, the forward and backward passes' per-call
work and the loop's own Python cost are paid once a step, whatever the batch. So a rank's rate at the even batch
(what the probe times) overstates a slow rank's rate at the smaller batch it gets, and understates a fast one's.
The probe times two batch sizes to separate the two parts (`step_fixed_seconds`), and the cut equalizes the
predicted step times (`shared_fixed_seconds`, then `balanced_speeds`). Where that would leave a rank under one
row per step (small batches, where a step is mostly fixed cost and no cut of the rows shortens it), the cut is
the proportional one instead, and says so (`driver.balancing`)."""

from __future__ import annotations

SPEED_TOLERANCE = 0.10
"""Speeds whose slowest is at least (1 - this) x the fastest are taken as equal machines and cut evenly. Cutting
by them would gain at most this fraction of the step time (the even step waits for the slowest rank, which is
at most 10% slower), while the probe's own spread on equal ranks is of that order (time slices, warm-up), so a
smaller tolerance would let noise move the cut; a larger one would leave real differences unbalanced."""


def within_tolerance(speeds: list[float], tolerance: float = SPEED_TOLERANCE) -> bool:
    """True when the slowest speed is at least (1 - `tolerance`) x the fastest: cut as `balance: even` does."""
    return min(speeds) >= (1.0 - tolerance) * max(speeds)


def weighted_sizes(total: int, speeds: list[float]) -> list[int]:
    """`total` rows cut in proportion to `speeds` (rows per second, one per rank).

    The documented rule (tests/reference-side code rebuilds it on its own): rank r first gets
    floor(total * speeds[r] / sum(speeds)); the rows left over go one each to the ranks with the
    largest remainders, ties to the lower rank. The sizes sum to `total`.
    """
    if not speeds or any(not s > 0 for s in speeds):
        raise ValueError(f"measured speeds {speeds} must all be > 0 rows/s")
    whole = sum(speeds)
    exact = [total * s / whole for s in speeds]
    sizes = [int(e) for e in exact]
    left = total - sum(sizes)
    by_remainder = sorted(range(len(speeds)), key=lambda r: (-(exact[r] - sizes[r]), r))
    for r in by_remainder[:left]:
        sizes[r] += 1
    return sizes


def check_shares(sizes: list[int], steps_per_epoch: int, speeds: list[float], hosts: list[str]) -> None:
    """Refuse a cut that leaves a rank under one row per step: that rank would idle through whole steps
    while the others wait for nothing, a sign it should not be in the run at all."""
    starved = [r for r, n in enumerate(sizes) if n < steps_per_epoch]
    if not starved:
        return
    r = starved[0]
    fastest = max(speeds)
    raise ValueError(
        f"balance=speed: rank {r} (on {hosts[r]}) measured {speeds[r]:.0f} rows/s against the fastest rank's "
        f"{fastest:.0f}, so its share is {sizes[r]} rows for {steps_per_epoch} steps per epoch (under one row per "
        f"step); lower num_workers, exclude that executor from the cluster, or set balance=even."
    )


def step_fixed_seconds(full_rows: int, full_seconds: float, half_rows: int, half_seconds: float) -> float:
    """The part of a step's time that does not grow with its rows: the intercept of the line through
    (half_rows, half_seconds) and (full_rows, full_seconds), two mean step times (the probe's are CPU seconds).
    Clamped to [0, half_seconds]; 0 when the two sizes are equal or the larger one did not take longer
    (noise), which leaves the cut proportional to the measured rates."""
    if full_rows <= half_rows or full_seconds <= half_seconds:
        return 0.0
    per_row = (full_seconds - half_seconds) / (full_rows - half_rows)
    return min(max(half_seconds - half_rows * per_row, 0.0), half_seconds)


def shared_fixed_seconds(probe_rows: int, speeds: list[float], fixed: list[float]) -> list[float]:
    """Every rank's fixed seconds a step, taken as the same fraction of its step at `probe_rows` rows: the
    fraction the fastest rank measured (the lowest rank among equals). A slower machine, or a CPU cap, is slower
    at the fixed and the per-row work alike, so the fraction is the model's and the batch's, not the rank's; and
    the fastest rank's steps are the least disturbed (a cap's throttling and other tasks' time slices left
    capped ranks measuring fractions up to 0.5 where uncapped ones measured 0.2, which starved them)."""
    fastest = max(range(len(speeds)), key=lambda r: (speeds[r], -r))
    fraction = fixed[fastest] * speeds[fastest] / probe_rows
    return [fraction * probe_rows / s for s in speeds]


def balanced_speeds(batch: int, probe_rows: int, speeds: list[float], fixed: list[float]) -> list[float]:
    """Each rank's rows per second at the local batch that gives every rank the same predicted step time.

    The documented rule: rank r's step with b rows takes fixed[r] + b * c[r] seconds, where
    c[r] = (probe_rows / speeds[r] - fixed[r]) / probe_rows (`speeds` were measured at `probe_rows` rows a
    step). The local batches b[r] = (T - fixed[r]) / c[r] sum to `batch` when
    T = (batch + sum(fixed[r] / c[r])) / sum(1 / c[r]), the sums over the ranks whose fixed cost is under T
    (a rank whose fixed cost alone exceeds T gets ~0: a share under one row per step, which the driver does
    not cut by, `driver.balancing`); the result is b[r] / T. With every fixed[r] = 0 it is `speeds` itself
    (the rule without fixed costs).
    """
    if not any(fixed):
        return list(speeds)  # exactly the proportional rule (checkpoints saved before fixed costs were measured)
    per_row = [(probe_rows / s - f) / probe_rows for s, f in zip(speeds, fixed, strict=True)]
    if any(not c > 0 for c in per_row):
        raise ValueError(f"fixed step costs {fixed} must be under the measured step times ({speeds} rows/s "
                         f"at {probe_rows} rows)")
    working = list(range(len(speeds)))
    while True:
        step = (batch + sum(fixed[r] / per_row[r] for r in working)) / sum(1 / per_row[r] for r in working)
        idle = [r for r in working if fixed[r] >= step]
        if not idle:
            break
        working = [r for r in working if r not in idle]
    return [max((step - f) / c, 1e-12) / step for f, c in zip(fixed, per_row, strict=True)]
