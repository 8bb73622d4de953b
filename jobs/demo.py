"""`make demo`: train an MLP on scikit-learn's digits with 4 Horovod workers on local[4].

    spark-submit jobs/demo.py          # or: .venv/bin/python jobs/demo.py

Prints the per-epoch loss, the run's metrics and the test accuracy. The
pipeline issue replaces this with `blocksync run --config conf/local.yaml`.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from blocksync import ModelSpec, TrainConfig, TrainingError, train
from blocksync.datasets import digits_frame, split_standardized
from blocksync.session import local_session


def main() -> int:
    spark = local_session("local[4]", "blocksync-demo")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        train_df, test_df, _ = split_standardized(
            digits_frame(spark), [f"pixel_{i}" for i in range(64)], test_fraction=0.2, seed=42
        )
        cfg = TrainConfig(num_workers=4, backend="horovod", epochs=30, batch_size=64, lr=2e-3,
                          model=ModelSpec(name="mlp", hidden=[128, 64]))
        print(f"training {cfg.model.name} on digits: {cfg.num_workers} workers, backend={cfg.backend}", flush=True)
        try:
            result = train(spark, train_df, cfg)
        except TrainingError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        for h in result.history[:: max(1, len(result.history) // 6)] + result.history[-1:]:
            print(f"  epoch {h['epoch']:>3}  step {h['step']:>5}  train_loss {h['train_loss']:.4f}")
        pdf = test_df.toPandas()
        x = torch.tensor(np.stack([v.toArray() for v in pdf["features"]]), dtype=torch.float32)
        with torch.no_grad():
            acc = float((result.model(x).argmax(1).numpy() == pdf["label"].to_numpy()).mean())
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.metrics.items()}, indent=1))
        print(f"block sizes {result.block_sizes}; test accuracy {acc:.4f}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
