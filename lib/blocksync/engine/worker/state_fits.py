"""Before a rank allocates its gradients and optimizer state: will they fit its memory cgroup?

Past a cgroup's limit the kernel kills the process with no Python error. So, after every
rank has built its model, the ranks that share a cgroup (same host, same cgroup path)
check together that what each still allocates (`sharding.training_state_bytes`) fits in
what the cgroup has left, and every rank raises the same error naming `train.shard`.
"""

from __future__ import annotations

import hashlib
import socket
from typing import TYPE_CHECKING

import torch

from blocksync.engine.comm.sharding import training_state_bytes
from blocksync.engine.worker.block_store import cgroup_memory

if TYPE_CHECKING:
    from blocksync.engine.comm.collectives import Collective
    from blocksync.engine.config import TrainConfig


class TrainingStateTooLarge(ValueError):
    """The gradients and optimizer state would not fit the workers' memory limit: a setting to change."""


def _cgroup_identity(proc_cgroup: str = "/proc/self/cgroup") -> str:
    try:
        with open(proc_cgroup) as fh:
            lines = [ln for ln in fh.read().splitlines() if "memory" in ln or ln.startswith("0::")]
    except OSError:
        lines = []
    return hashlib.sha1(f"{socket.gethostname()}|{lines}".encode()).hexdigest()


def check_state_fits(coll: Collective, cfg: TrainConfig, num_params: int,
                     memory: tuple[int, int] | None = None, largest: int = 0) -> None:
    """Collective: raise `TrainingStateTooLarge` on every rank when the ranks sharing a memory cgroup would
    need more than it has left. `memory`: (limit, in use) for tests; by default this process's cgroup.
    `largest`: the entries of the model's largest parameter (its gradient and Adam's temporaries)."""
    memory = memory if memory is not None else cgroup_memory()
    sharing = coll.gather_digests(_cgroup_identity())
    parts = training_state_bytes(num_params, cfg, coll.size, largest)
    need = sum(parts.values()) * sharing.count(sharing[coll.rank])
    # One rank per cgroup (the first that shares it) reports its shortfall: the sum is the total excess.
    reports = memory is not None and sharing.index(sharing[coll.rank]) == coll.rank
    short = max(float(need - (memory[0] - memory[1])), 0.0) if memory is not None and reports else 0.0
    excess = float(coll.allreduce_sum(torch.tensor([short], dtype=torch.float32))[0])
    if excess <= 0:
        return
    mib = {k: f"{v / 2**20:,.0f}" for k, v in parts.items()}
    fix = ("set train.shard=optimizer (each rank keeps 1/num_workers of the optimizer state), raise num_workers, "
           "or raise the executors' memory" if cfg.shard == "none" else
           "raise num_workers (a smaller slice each) or the executors' memory")
    raise TrainingStateTooLarge(
        f"shard={cfg.shard!r}: each rank would allocate {sum(parts.values()) / 2**20:,.0f} MiB more for its "
        f"{num_params:,} parameters (gradients {mib['gradients']}, optimizer state {mib['optimizer']}, transient "
        f"buffers {mib['transient']} MiB), and the ranks sharing a memory cgroup would exceed its limit by "
        f"{excess / 2**20:,.0f} MiB; {fix}."
    )
