"""spark-submit entry point for the `evaluate` stage; the same as `blocksync evaluate`.

    spark-submit jobs/evaluate.py --config conf/local.yaml [key.sub=value ...]
"""

import sys

from blocksync.pipeline.cli import console

if __name__ == "__main__":
    console(sys.argv[1:], stage="evaluate")
