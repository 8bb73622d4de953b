"""blocksync: block-synchronous data-parallel PyTorch training on Spark.

    from blocksync import TrainConfig, train
    result = train(spark, df, TrainConfig(num_workers=4), features="features", label="label")
    result.model, result.metrics
"""

from blocksync.engine.blocks import BlockInfo, make_blocks
from blocksync.engine.collectives import CollectiveError
from blocksync.engine.config import ModelSpec, TrainConfig
from blocksync.engine.inputs import Input, InputSpec
from blocksync.engine.launcher import TrainingError, TrainResult, train, train_blocks, train_files
from blocksync.pipeline.artifacts import SavedModel, load_model

__version__ = "0.1.0"

__all__ = [
    "BlockInfo",
    "CollectiveError",
    "Input",
    "InputSpec",
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
