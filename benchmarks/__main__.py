"""`python -m benchmarks [name ...]` (make bench): run benchmarks, write benchmarks/results/.

Order matters for `scaling`: it is a model fed by the throughput and
compression results, so it runs after them (or from their recorded files).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from benchmarks.common import SettingError

BENCHMARKS = ("allreduce", "throughput", "horovod_profile", "horovod_env", "compression", "peers", "bigmodel",
              "bigmodel_transformer", "memory", "memory_limit", "epoch_order", "scoring", "model_selection", "accuracy",
              "balance", "demo", "netcluster", "scaling", "sharding", "sharding_limit")
NEEDS_SPARK = ("allreduce", "throughput", "horovod_profile", "compression", "peers", "bigmodel", "bigmodel_transformer",
               "memory", "epoch_order", "scoring", "model_selection", "accuracy", "sharding")
REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    names = [n for n in BENCHMARKS if n in names]
    modules = {n: importlib.import_module(f"benchmarks.{n}") for n in names}
    try:  # a benchmark's own settings, before Spark starts
        for module in modules.values():
            getattr(module, "check", lambda: None)()
    except SettingError as err:
        print(f"benchmarks: {err}", file=sys.stderr)
        return 2
    # Executors import benchmarks.peer_fns (TorchDistributor, horovod.spark.run): the JVM passes this on.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    spark = None
    if any(n in NEEDS_SPARK for n in names):
        from blocksync.pipeline.session import local_session

        spark = local_session("local[4]", "blocksync-bench", {"spark.driver.memory": "6g",
                                                              "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
    try:
        for name in names:
            start, began = time.perf_counter(), time.time()
            print(f"== {name}", flush=True)
            modules[name].run(spark)
            written = sorted(p.name for p in (REPO / "benchmarks" / "results").glob(f"{name}.*")
                             if p.stat().st_mtime >= began)
            print(f"== {name}: wrote {', '.join(f'benchmarks/results/{w}' for w in written) or 'nothing'} in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    finally:
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
