"""blocksync: block-synchronous data-parallel PyTorch training on Spark.

    from blocksync import TrainConfig, train
    result = train(spark, df, TrainConfig(num_workers=4), features="features", label="label")
    result.model, result.metrics
"""

from blocksync.artifacts import SavedModel, load_model
from blocksync.blocks import BlockInfo, make_blocks
from blocksync.collectives import CollectiveError
from blocksync.config import ModelSpec, TrainConfig
from blocksync.launcher import TrainingError, TrainResult, train, train_blocks, train_files

__version__ = "0.1.0"

__all__ = [
    "BlockInfo",
    "CollectiveError",
    "ModelSpec",
    "SavedModel",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "load_model",
    "make_blocks",
    "train",
    "train_blocks",
    "train_files",
]
