"""Run several `blocksync` CLI invocations in one process (one JVM), reporting exit code, stderr and seconds of each.

Used by test_hostile_input.py: `python -m tests.cli_cases cases.json results.json`.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time

from blocksync.pipeline.cli import main


def run_all(cases: list[list[str]]) -> list[dict]:
    results = []
    for argv in cases:
        err = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        results.append({"code": code, "stderr": err.getvalue(), "seconds": time.perf_counter() - started})
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        cases = json.load(fh)
    with open(sys.argv[2], "w") as fh:
        json.dump(run_all(cases), fh)
