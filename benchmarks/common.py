"""What every benchmark records: the machine, medians over alternating repetitions, and the files written."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


class SettingError(ValueError):
    """A setting a benchmark cannot run with; the message names it and the fix (`python -m benchmarks` exits 2)."""


def machine() -> dict[str, Any]:
    import horovod
    import pyspark
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyspark": pyspark.__version__,
        "horovod": horovod.__version__,
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def provenance() -> dict[str, Any]:
    """When and from which commit a result was measured (a dirty tree says so)."""
    import datetime
    import subprocess

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=RESULTS.parent.parent, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else "unknown"

    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "HEAD"),
            # Code only: results written earlier in the same `make bench` do not make the tree dirty.
            "dirty": bool(git("status", "--porcelain", "--", "lib", "benchmarks", ":!benchmarks/results"))}


def write(name: str, payload: dict[str, Any], markdown: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {**provenance(), "machine": machine(), **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown)
    return RESULTS / f"{name}.json"


def figure(width: float = 7, height: float = 4, ncols: int = 1):
    """A matplotlib (figure, axes) on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


def save_figure(fig, name: str) -> None:
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)


def cached_blocks(spark, files: list[str], workers: int, seed: int = 0):
    """blocksync's blocks of these Parquet files for `workers` workers, cut once and cached: (blocks, info).

    Spark answers any later query with the same plan from this cache: a timed `train`
    on the same files must use another seed, or it would skip cutting its blocks.
    """
    from blocksync.engine.driver.blocks import make_blocks

    blocks, info = make_blocks(spark.read.parquet(*files), features="features", label="label",
                               num_workers=workers, seed=seed)
    blocks = blocks.cache()
    blocks.count()
    return blocks, info


def written_bytes() -> int:
    """This process's `wchar` from /proc/self/io: bytes passed to write/writev, which Gloo's TCP pairs use."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def task_collective(batches, backend: str):
    """Inside a benchmark's barrier task: drain its input, one torch thread, the backend started."""
    import torch
    from pyspark import BarrierTaskContext

    from blocksync.engine.comm.collectives import start_collective

    for _ in batches:  # the input rows only place the tasks
        pass
    torch.set_num_threads(1)
    return start_collective(backend, BarrierTaskContext.get(), timeout_seconds=300, interface=None)


def steady_step_seconds(result, warmup: int) -> float:
    """Rank 0's median step period (start of one step to the next) after `warmup` steps."""
    starts = [t[0] for t in result.rank_summaries[0]["step_timings"]]
    return float(statistics.median(b - a for a, b in zip(starts[warmup:], starts[warmup + 1:], strict=False)))
