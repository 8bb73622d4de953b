"""PySpark's worker daemon, started inside a memory cgroup (the `memory_limit` benchmark's enforced limit).

Spark runs `python -m <spark.python.daemon.module>` once per executor and forks every Python worker
from it, so a daemon that moves itself into the cgroup named by BLOCKSYNC_BENCH_CGROUP before it
imports anything puts every worker under that cgroup's limit, as a container would.
"""

import os
from pathlib import Path

Path(os.environ["BLOCKSYNC_BENCH_CGROUP"], "cgroup.procs").write_text(str(os.getpid()))

from pyspark import daemon  # noqa: E402  (after joining the cgroup: imports count against it)

import blocksync.daemon  # noqa: E402, F401  (torch imported once, as blocksync's own daemon does)

if __name__ == "__main__":
    daemon.manager()
