"""Heterogeneous workers: samples/s of balance=even and balance=speed with one slow rank, against no slow rank.

The job: `train_files` on 24,576 synthetic rows x 64 features (Parquet written here), blocksync's `mlp`
(64 -> 256 -> 256 -> 2), Adam, a global batch of 1,024, 2 epochs, torch_gloo, one thread per worker.
Rank 0 is the straggler, `faults.slow_factor` (its compute takes that many times as long: a slower
machine, per row). Cases: N = 2 and 4 with rank 0 at half speed (factor 2), and a mixed case (N = 4,
rank 0 at factor 1.5). Per case, three contenders alternate, REPETITIONS rounds: `none` (no slow rank,
balance=even), `even` (the slow rank, balance=even) and `speed` (the slow rank, balance=speed).
Reported: the median of metrics.json `samples_per_sec` (the training loop; the probe's cost is
`startup_phases.probe_s`, reported beside it) and each contender / `none`. Target (issue #34):
speed >= 0.85x none at half speed; even is expected near 0.5x.

On a machine with fewer cores than N, the ranks share cores and a sleeping straggler frees its core for
the others, so the ratios there are not those of a cluster of separate machines: see `cores` in the
record.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import median, write

ROWS = 24_576
FEATURES = 64
CASES = [(2, 2.0), (4, 2.0), (4, 1.5)]  # (num_workers, slow_factor of rank 0)
REPETITIONS = 2


def _files(spark) -> str:
    import tempfile

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float64)
    folder = tempfile.mkdtemp(prefix="blocksync-balance-")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"features": pa.array(list(x), pa.list_(pa.float32())), "label": y}),
                   f"{folder}/part-0.parquet", row_group_size=4096)
    return folder


def _one(spark, path: str, workers: int, factor: float, contender: str) -> dict:
    from blocksync import ModelSpec, TrainConfig, train_files

    faults = {} if contender == "none" else {"slow_rank": 0, "slow_factor": factor}
    cfg = TrainConfig(num_workers=workers, backend="torch_gloo", epochs=2, batch_size=1024, threads_per_worker=1,
                      model=ModelSpec(name="mlp", hidden=[256, 256]), balance="speed" if contender == "speed" else
                      "even", faults=faults, check_every=0)
    result = train_files(spark, path, cfg)
    balance = result.metrics["balance"]
    return {"samples_per_sec": result.metrics["samples_per_sec"], "block_sizes": result.block_sizes,
            "sync_idle_seconds": balance["sync_idle_seconds"],
            "probe_s": result.metrics["startup_phases"].get("probe_s")}


def run(spark) -> None:
    path = _files(spark)
    cases = []
    for workers, factor in CASES:
        runs: dict[str, list[dict]] = {"none": [], "even": [], "speed": []}
        for _ in range(REPETITIONS):
            for contender in runs:  # alternating, so drifts in the machine's load hit all three
                runs[contender].append(_one(spark, path, workers, factor, contender))
        rate = {c: median([r["samples_per_sec"] for r in rs]) for c, rs in runs.items()}
        cases.append({"num_workers": workers, "slow_factor": factor, "samples_per_sec": rate,
                      "vs_none": {c: rate[c] / rate["none"] for c in rate}, "runs": runs})
    lines = ["# balance: one slow rank, balance=even vs speed vs no slow rank", "",
             "| N | rank 0 slow factor | none samples/s | even (x none) | speed (x none) | speed blocks | probe s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in cases:
        speed = c["runs"]["speed"][-1]
        lines.append(f"| {c['num_workers']} | {c['slow_factor']:g} | {c['samples_per_sec']['none']:,.0f} | "
                     f"{c['samples_per_sec']['even']:,.0f} ({c['vs_none']['even']:.2f}x) | "
                     f"{c['samples_per_sec']['speed']:,.0f} ({c['vs_none']['speed']:.2f}x) | "
                     f"{speed['block_sizes']} | {speed['probe_s']:.2f} |")
    write("balance", {"rows": ROWS, "features": FEATURES, "repetitions": REPETITIONS, "cases": cases},
          "\n".join(lines) + "\n")
