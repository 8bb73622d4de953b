"""Spark ML Estimators: `fit` runs the same barrier stage as `train()`, through `train()` itself.

    from blocksync.ml import BlockSyncClassifier
    clf = BlockSyncClassifier(numWorkers=4, epochs=20, model={"name": "mlp", "hidden": [64]})
    model = Pipeline(stages=[assembler, indexer, scaler, clf]).fit(train_df)
    model.transform(test_df)  # every input column + prediction, rawPrediction, probability

The Params are TrainConfig's settings (see `params`): each value is checked
when it is set, and their combination when `fit` starts, before any Spark job. The classifier needs class indices 0..K-1
as labels (StringIndexer makes them); the regressor a numeric label.

Tuners: CrossValidator and TrainValidationSplit fit one model per Param map,
`parallelism` at a time. Each fit is a barrier stage of `numWorkers` tasks, so
parallel fits in one driver take turns when together they would need more task
slots than the cluster has: a waiting fit logs why (the `SlotGate`), rather
than queueing a barrier stage Spark cannot start.

A run whose loss becomes NaN or infinite fails the fit (TrainingError); a
large learning rate whose loss grows but stays finite yields a poor model,
which a tuner ranks below the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasProbabilityCol, HasRawPredictionCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame

from blocksync.engine.driver.launcher import task_slots, train
from blocksync.engine.models import state_bytes
from blocksync.ml.model import BlockSyncClassificationModel, BlockSyncModelBase, BlockSyncRegressionModel
from blocksync.ml.params import TrainParams, _optional, checked

log = logging.getLogger(__name__)


class SlotGate:
    """Task slots held by this driver's running fits; a fit that would overrun the cluster waits its turn."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.held = 0

    @contextmanager
    def hold(self, needed: int, slots: int | None) -> Iterator[None]:
        with self._cond:
            if slots is not None and self.held and self.held + needed > slots:
                log.warning(
                    "this fit waits for another blocksync fit to finish: it needs %d task slots (numWorkers) and "
                    "%d of the cluster's %d are held, so parallel fits (a tuner's parallelism) run one at a time; "
                    "for parallel fits lower numWorkers or add executor cores", needed, self.held, slots)
            while slots is not None and self.held and self.held + needed > slots:
                self._cond.wait()
            self.held += needed
        try:
            yield
        finally:
            with self._cond:
                self.held -= needed
                self._cond.notify_all()


SLOT_GATE = SlotGate()


class _BlockSyncEstimator(Estimator, TrainParams, DefaultParamsReadable, DefaultParamsWritable):
    task = "classification"
    model_class: type[BlockSyncModelBase] = BlockSyncModelBase

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.setParams(**params)

    def setParams(self, **params: Any) -> _BlockSyncEstimator:
        """Set Params by name (`lr=0.01, numWorkers=2, model={...}`); an unknown name raises naming it."""
        unknown = sorted(n for n in params if not self.hasParam(n))
        if unknown:
            known = ", ".join(sorted(p.name for p in self.params))
            raise ValueError(f"{type(self).__name__} has no Param(s) {unknown}; the Params are: {known}.")
        return self._set(**params)

    def _extra_settings(self) -> dict[str, Any]:
        return {}

    def _fit(self, dataset: DataFrame) -> BlockSyncModelBase:
        config = self.train_config(self.task, **self._extra_settings())
        spark = dataset.sparkSession
        with SLOT_GATE.hold(config.num_workers, task_slots(spark)):
            result = train(spark, dataset, config, features=self.features_spec(), label=self.getLabelCol(),
                           progress=self.getOrDefault("progress"), validation=self.validation_column(),
                           weight=self.weight_column(), inputs=self.getOrDefault("inputs"))
        weights = state_bytes(result.model)
        meta = {"model": asdict(config.model), "num_features": result.num_features,
                "inputs": result.inputs.to_dicts() if result.inputs else None,
                "num_outputs": result.num_outputs, "task": self.task, "history": result.history,
                "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, int | float | str)}}
        return self._copyValues(self.model_class(weights, meta))


class BlockSyncClassifier(_BlockSyncEstimator, HasProbabilityCol, HasRawPredictionCol):
    """Cross-entropy over class indices 0..K-1; fits a `BlockSyncClassificationModel`."""

    numClasses: Param[int] = Param(Params._dummy(), "numClasses", "output classes; None: max label + 1",
                                   typeConverter=checked("numClasses", "num_classes",
                                                         _optional(TypeConverters.toInt)))
    model_class = BlockSyncClassificationModel

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._setDefault(numClasses=None)
        self.setParams(**params)

    def _extra_settings(self) -> dict[str, Any]:
        return {"num_classes": self.getOrDefault("numClasses")}


class BlockSyncRegressor(_BlockSyncEstimator):
    """Mean squared error on a numeric label; fits a `BlockSyncRegressionModel`."""

    task = "regression"
    model_class = BlockSyncRegressionModel
