"""The fitted models: Spark ML Transformers that score on the executors.

`transform` keeps every input column and appends `predictionCol` (double) and,
for the classifier, `rawPredictionCol` (the network's logits) and
`probabilityCol` (their softmax), both as Spark ML vectors, so the MLlib
evaluators read the output directly. An output column Param set to "" is not
written, nor computed: the Python side returns only the requested outputs.

Scoring runs through `pyspark.ml.functions.predict_batch_udf`: each Python
worker builds the network from the safetensors weights once (Spark's model
cache) and scores `scoreBatchSize` rows per call, with as many torch threads as
`spark.task.cpus`. A row whose features are not `numFeatures` wide fails the
job with a message naming `featuresCol` and both widths. A model fitted with typed `inputs` scores
the same input columns: `transform` first checks their ids on the driver (one aggregate), so a
category unseen in training is a one-line ValueError, then packs them as training did.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from pyspark.ml.functions import array_to_vector, predict_batch_udf
from pyspark.ml.param import Param, Params
from pyspark.ml.param.shared import HasProbabilityCol, HasRawPredictionCol
from pyspark.ml.util import MLReadable, MLWritable
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blocksync.engine.config import ModelSpec
from blocksync.engine.driver.blocks import features_column
from blocksync.engine.driver.input_columns import check_ids, packed_columns
from blocksync.engine.inputs import inputs_of, network_input
from blocksync.engine.models import module_from_bytes
from blocksync.ml.params import TrainParams, at_least_one
from blocksync.ml.persistence import ModelReader, ModelWriter, PersistedModel

SCORED = "__blocksync_scored"
CHECKED = "blocksync rejected a row: "
"""Opens the message of every row check in a scoring query (`F.raise_error`): `raised_by_check` finds it."""


def invalid_values(x: Column) -> Column:
    """True where the feature array `x` is null or holds a null, NaN or infinite value."""
    return x.isNull() | F.exists(x, lambda v: v.isNull() | F.isnan(v) | (F.abs(v) == F.lit(float("inf"))))


def reject(condition: Column, message: str, x: Column) -> Column:
    """`x`, except that a row where `condition` holds fails the query with `message` (`raised_by_check`)."""
    return F.when(condition, F.raise_error(F.lit(CHECKED + message))).otherwise(x)


def raised_by_check(err: BaseException) -> str | None:
    """The message of a row check that failed `err`'s Spark job, or None for any other failure."""
    found = re.search(re.escape(CHECKED) + r"(.+?)(?: SQLSTATE: |\n|$)", str(err))
    return found.group(1).strip() if found else None


def build_module(meta: dict[str, Any], weights: bytes) -> torch.nn.Module:
    """The network `meta` describes, with `weights` (safetensors bytes) loaded, in eval mode."""
    return module_from_bytes(ModelSpec(**meta["model"]), int(meta["num_features"]), int(meta["num_outputs"]), weights,
                             inputs_of(meta))


def _make_predict(meta: dict[str, Any], weights: bytes,
                  fields: tuple[str, ...]) -> Callable[..., dict[str, np.ndarray]]:
    """Runs once per Python worker (predict_batch_udf caches it): the network, then its batch scorer,
    which returns `fields` only, of `prediction` (always), `raw` (the logits) and `probability`."""
    from pyspark import TaskContext

    context = TaskContext.get()
    torch.set_num_threads(max(1, int(context.cpus())) if context is not None else 1)
    module = build_module(meta, weights)
    classification = meta["task"] == "classification"
    spec = inputs_of(meta)

    def scores(*arrays: np.ndarray) -> dict[str, np.ndarray]:
        # Typed inputs arrive as (floats, ids), either left out when its width is 0 (see `_features`).
        floats = arrays[0] if spec is None or spec.float_width else np.zeros((len(arrays[0]), 0), np.float32)
        ids = arrays[-1] if spec is not None and spec.id_width else None
        with torch.no_grad():
            out = module(network_input(spec, floats, ids)).double()
        if not classification:
            return {"prediction": out.squeeze(-1).numpy()}
        every = {"prediction": lambda: out.argmax(dim=1).double().numpy(), "raw": out.numpy,
                 "probability": lambda: torch.softmax(out, dim=1).numpy()}
        return {f: every[f]() for f in fields}

    # predict_batch_udf passes one array per parameter it counts in the signature: name them.
    if spec is not None and spec.float_width and spec.id_width:
        def predict_pair(floats: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
            return scores(floats, ids)

        return predict_pair

    def predict(values: np.ndarray) -> dict[str, np.ndarray]:
        return scores(values)

    return predict


class BlockSyncModelBase(PersistedModel, TrainParams, MLWritable, MLReadable):
    """What both fitted models share: the weights, what the network is, and scoring."""

    scoreBatchSize: Param[int] = Param(Params._dummy(), "scoreBatchSize", "rows per call of the network in transform",
                                       typeConverter=at_least_one("scoreBatchSize"))

    def __init__(self, weights: bytes = b"", meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._setDefault(scoreBatchSize=4096)
        self._weights = weights
        self._meta = meta or {}

    @property
    def numFeatures(self) -> int:
        return int(self._meta["num_features"])

    @property
    def history(self) -> list[dict[str, float]]:
        """Per epoch, as `train` returns it: epoch, step, train_loss (train_accuracy), and val_loss (val_accuracy)
        with validation."""
        return list(self._meta.get("history", []))

    def torchModule(self) -> torch.nn.Module:
        """A fresh copy of the trained network (eval mode, CPU)."""
        return build_module(self._meta, self._weights)

    def write(self) -> ModelWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> ModelReader:
        return ModelReader(cls)

    def _outputs(self) -> dict[str, tuple[str, Callable[[Column], Column]]]:
        """Output Param value -> (the scorer's field, how that field becomes the column)."""
        return {self.getPredictionCol(): ("prediction", lambda c: c)}

    def _features(self, dataset: DataFrame) -> tuple[list[Column], list[list[int]]]:
        """The scorer's input columns and their shapes: the features, or with typed inputs their packed floats
        and ids (each only when not empty), after a driver-side check of the ids (`check_ids`)."""
        spec = inputs_of(self._meta)
        if spec is None:
            return [self._feature_matrix(dataset)], [[self.numFeatures]]
        check_ids(dataset, spec)
        floats, ids = packed_columns(dataset, spec)
        parts = [(floats, spec.float_width), (ids, spec.id_width)]
        return [c for c, width in parts if width], [[width] for _, width in parts if width]

    def _feature_matrix(self, dataset: DataFrame) -> Column:
        x = features_column(dataset, self.features_spec())
        width = self.numFeatures
        where = "featuresCols" if self.isSet("featuresCols") else f"featuresCol {self.getFeaturesCol()!r}"
        message = F.concat(F.lit(f"{CHECKED}{where} has "), F.size(x).cast("string"),
                           F.lit(f" values in a row; this model was trained on {width}: transform a table "
                                 "prepared like the training one (same VectorAssembler inputs)"))
        x = reject(invalid_values(x), f"{where} has a null, NaN or infinite value in a row; the network scores "
                   "numbers only: fill or drop those rows first (e.g. df.na.drop() or Imputer)", x)
        return F.when(F.size(x) == width, x).otherwise(F.raise_error(message))

    def _transform(self, dataset: DataFrame) -> DataFrame:
        outputs = {col: how for col, how in self._outputs().items() if col}
        clash = sorted(set(outputs) & set(dataset.columns))
        if clash:
            raise ValueError(f"the input already has column(s) {clash}; set other output column names "
                             "(predictionCol, probabilityCol, rawPredictionCol) or drop them first.")
        # Only the requested outputs cross from Python (an empty column Param skips one), prediction always.
        fields = tuple(dict.fromkeys(["prediction", *(field for field, _ in outputs.values())]))
        schema = T.StructType([T.StructField(f, T.DoubleType() if f == "prediction" else T.ArrayType(T.DoubleType()))
                               for f in fields])
        columns_in, shapes = self._features(dataset)
        scorer = predict_batch_udf(partial(_make_predict, self._meta, self._weights, fields), return_type=schema,
                                   batch_size=self.getOrDefault("scoreBatchSize"),
                                   input_tensor_shapes=shapes)  # type: ignore[arg-type]
        scored = dataset.withColumn(SCORED, scorer(*columns_in))
        columns = [F.col(c) for c in dataset.columns]
        columns += [how(F.col(f"{SCORED}.{field}")).alias(col) for col, (field, how) in outputs.items()]
        return scored.select(*columns)


class BlockSyncClassificationModel(BlockSyncModelBase, HasProbabilityCol, HasRawPredictionCol):
    """A fitted `BlockSyncClassifier`: prediction (class index), rawPrediction (logits), probability."""

    @property
    def numClasses(self) -> int:
        return int(self._meta["num_outputs"])

    def _outputs(self) -> dict[str, tuple[str, Callable[[Column], Column]]]:
        return {**super()._outputs(), self.getRawPredictionCol(): ("raw", array_to_vector),
                self.getProbabilityCol(): ("probability", array_to_vector)}


class BlockSyncRegressionModel(BlockSyncModelBase):
    """A fitted `BlockSyncRegressor`: prediction."""
