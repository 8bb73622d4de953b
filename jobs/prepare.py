"""spark-submit entry point for the `prepare` stage; the same as `blocksync prepare`.

    spark-submit jobs/prepare.py --config conf/local.yaml [key.sub=value ...]
"""

import sys

from blocksync.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], stage="prepare"))
