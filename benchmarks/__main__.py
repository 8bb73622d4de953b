"""`python -m benchmarks [name ...]` (make bench): run the benchmarks and write benchmarks/results/."""

from __future__ import annotations

import sys

from blocksync.session import local_session

BENCHMARKS = ("allreduce",)


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    spark = local_session("local[4]", "blocksync-bench", {"spark.driver.memory": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if "allreduce" in names:
            from benchmarks import allreduce

            allreduce.run(spark)
            print("wrote benchmarks/results/allreduce.{json,md,png}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
