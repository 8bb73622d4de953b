"""One fresh process of the demo benchmark's start-up comparisons: `python -m benchmarks.startup_probe MODE`.

- `sequential`: import what `blocksync run` imports for conf/local.yaml, then start the Spark session
  (what the CLI did before it overlapped the two).
- `overlapped`: the CLI's own `session_with_preload`: the same imports on a thread while the session starts.
- `exit_collected`, `exit_frozen`: import the same modules, then exit as a plain interpreter does, or
  after `gc.freeze()` as the CLI's `console` does.

The session modes print the seconds from the process's start until the session was up and the imports
done; the caller times every mode from outside, exit included.
"""

from __future__ import annotations

import gc
import importlib
import sys
import time

from blocksync.engine.worker.startup import process_started_at


def main(mode: str) -> None:
    from blocksync.pipeline import cli
    from blocksync.pipeline.run_config import load_config
    from blocksync.pipeline.session import jvm_log_path

    config = load_config("conf/local.yaml", [])
    modules = cli.stage_modules("run", config)
    if mode in ("sequential", "overlapped"):
        if mode == "sequential":
            for name in modules:
                importlib.import_module(name)
            spark = cli.session_for(config)
        else:
            spark = cli.session_with_preload(config, modules)
        print(f"{time.time() - process_started_at():.3f}", flush=True)
        spark.stop()
        jvm_log_path().unlink(missing_ok=True)
        return
    for name in modules:
        importlib.import_module(name)
    if mode == "exit_frozen":
        gc.freeze()


if __name__ == "__main__":
    main(sys.argv[1])
