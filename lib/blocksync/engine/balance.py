"""`balance: speed`: block sizes in proportion to each rank's measured step rate (`weighted_sizes`), unless the
speeds are within `SPEED_TOLERANCE` of each other (`within_tolerance`): then the cut is `even`'s."""

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
