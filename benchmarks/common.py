"""What every benchmark records: the machine, medians over alternating repetitions, and the files written."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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


def write(name: str, payload: dict[str, Any], markdown: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), **payload}, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown)
    return RESULTS / f"{name}.json"
