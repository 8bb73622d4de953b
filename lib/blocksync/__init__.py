"""blocksync: block-synchronous data-parallel PyTorch training on Spark.

    from blocksync import TrainConfig, train
    result = train(spark, df, TrainConfig(num_workers=4), features="features", label="label")
    result.model, result.metrics

The public names load on first use (PEP 562), so importing the package imports no torch: the CLI
starts the JVM first and loads the engine meanwhile (`blocksync.pipeline.cli`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blocksync.engine.config import ModelSpec, TrainConfig
    from blocksync.engine.driver.blocks import BlockInfo, make_blocks
    from blocksync.engine.driver.launcher import TrainResult, train, train_blocks, train_files
    from blocksync.engine.errors import CollectiveError, TrainingError
    from blocksync.engine.inputs import Input, InputSpec
    from blocksync.pipeline.artifacts import SavedModel, load_model

__version__ = "0.1.0"

_HOME = {
    "BlockInfo": "blocksync.engine.driver.blocks",
    "make_blocks": "blocksync.engine.driver.blocks",
    "ModelSpec": "blocksync.engine.config",
    "TrainConfig": "blocksync.engine.config",
    "CollectiveError": "blocksync.engine.errors",
    "TrainingError": "blocksync.engine.errors",
    "Input": "blocksync.engine.inputs",
    "InputSpec": "blocksync.engine.inputs",
    "TrainResult": "blocksync.engine.driver.launcher",
    "train": "blocksync.engine.driver.launcher",
    "train_blocks": "blocksync.engine.driver.launcher",
    "train_files": "blocksync.engine.driver.launcher",
    "SavedModel": "blocksync.pipeline.artifacts",
    "load_model": "blocksync.pipeline.artifacts",
}
"""Each public name and the module that defines it."""

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


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'blocksync' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
