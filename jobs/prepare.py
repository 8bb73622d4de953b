"""spark-submit entry point for the `prepare` stage; the same as `blocksync prepare`.

    spark-submit jobs/prepare.py --config conf/local.yaml [key.sub=value ...]
"""

import sys

from blocksync.pipeline.cli import console

if __name__ == "__main__":
    console(sys.argv[1:], stage="prepare")
