"""spark-submit entry point for scoring new data; the same as `blocksync predict`.

    spark-submit jobs/predict.py --model runs/local --input new.parquet --output scored.parquet
"""

import sys

from blocksync.pipeline.cli import console

if __name__ == "__main__":
    console(sys.argv[1:], stage="predict")
