"""`backend: auto` resolved on the driver, before launch, by the rule the benchmarks measured.

`choose_backend` says which backend and why; the choice is logged and recorded as metrics.json `backend`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from blocksync.engine.config import TrainConfig

log = logging.getLogger(__name__)


def choose_backend(task_gpus: float, device: str, horovod_nccl: bool) -> tuple[str, str]:
    """(backend, reason) for `backend: auto`.

    horovod where the run trains on GPUs (Spark gives each task a GPU and `device` is not cpu) and
    Horovod is built with NCCL: NCCL all-reduces device memory, where Gloo stages through the host.
    Everywhere else torch_gloo: on CPUs Horovod 0.28.1's background thread runs a coordination round
    every cycle and takes CPU from the training loop of ranks sharing cores, so it trains slower than
    torch_gloo on the same job (benchmarks/README.md, "Horovod against torch_gloo").
    """
    if task_gpus > 0 and device != "cpu":
        if horovod_nccl:
            return "horovod", "GPU tasks and a Horovod built with NCCL"
        return "torch_gloo", "GPU tasks, but no Horovod built with NCCL imports here (Gloo stages through the host)"
    return "torch_gloo", "CPU tasks: torch_gloo trains faster than Horovod on the CPU (benchmarks/README.md)"


def resolve_backend(spark: Any, config: TrainConfig) -> TrainConfig:
    """`config` with `backend: auto` replaced by the chosen backend (logged with its reason)."""
    if config.backend != "auto":
        return config
    task_gpus = float(spark.conf.get("spark.task.resource.gpu.amount", "0") or 0)
    backend, reason = choose_backend(task_gpus, config.device, task_gpus > 0 and _horovod_nccl())
    log.info("backend=auto chose %s: %s", backend, reason)
    return replace(config, backend=backend)  # type: ignore[arg-type]


def _horovod_nccl() -> bool:
    try:
        import horovod.torch as hvd

        return bool(hvd.nccl_built())
    except Exception:  # not installed, or built against another torch: no NCCL to use
        return False
