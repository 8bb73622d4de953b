"""spark-submit entry point for the `train` stage; the same as `blocksync train`.

    spark-submit jobs/train.py --config conf/local.yaml [key.sub=value ...]
"""

import sys

from blocksync.pipeline.cli import console

if __name__ == "__main__":
    console(sys.argv[1:], stage="train")
