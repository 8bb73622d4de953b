"""PySpark's worker daemon with torch already imported: `spark.python.daemon.module=blocksync.daemon`.

PySpark starts one daemon per executor and forks every Python worker from it.
Stock, each forked worker imports torch itself when the training closure is
unpickled (about 1 s each), and again torch._dynamo when the first optimizer
is built (torch.optim's `add_param_group` is wrapped by `torch._disable_dynamo`,
which imports it: about 0.9 s). With 4 workers on 2 cores those imports took
3 s each before the first step (`metrics.json` `startup_phases`). Imported
here once, the forked workers inherit them, copy-on-write.

Nothing here starts a thread or touches a GPU before the fork: importing torch
does neither (CUDA initializes lazily, in the worker). The imported objects are
frozen (`gc.freeze`), so the workers' collections do not copy their pages.
"""

from __future__ import annotations

import gc

import torch
import torch._dynamo  # noqa: F401  (see above: the first optimizer imports it)
from pyspark import daemon

import blocksync.engine.worker.worker  # noqa: F401  (the training closure's own imports)

# The imports' objects are never collected: frozen, a worker's garbage collections leave their pages
# shared with the daemon instead of copying them (a memory cgroup counts every copied page).
gc.freeze()

if __name__ == "__main__":
    assert torch.__version__  # keeps the import explicit
    daemon.manager()
