"""spark-submit entry point for a whole run (prepare, train, evaluate); the same as `blocksync run`.

    spark-submit jobs/pipeline.py --config conf/local.yaml [--overwrite] [key.sub=value ...]
"""

import sys

from blocksync.pipeline.cli import console

if __name__ == "__main__":
    console(sys.argv[1:], stage="run")
