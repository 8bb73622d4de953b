"""The Spark ML API: Estimators that fit in a Pipeline, Models that transform and persist.

    from blocksync.ml import BlockSyncClassifier, BlockSyncRegressor

See `estimator` (fit, tuners), `model` (transform) and `persistence` (save, load).
"""

from blocksync.ml.estimator import BlockSyncClassifier, BlockSyncRegressor
from blocksync.ml.model import BlockSyncClassificationModel, BlockSyncRegressionModel

__all__ = ["BlockSyncClassificationModel", "BlockSyncClassifier", "BlockSyncRegressionModel", "BlockSyncRegressor"]
