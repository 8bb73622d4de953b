"""The scoring stage: distributed inference with mapInPandas, metrics from pyspark.ml.evaluation.

The weights travel once per executor (a Spark broadcast of the safetensors
bytes; on Spark Connect, inside the pickled function) and each task builds the
network once, then scores whole Arrow batches at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.ml.evaluation import MulticlassClassificationEvaluator, RegressionEvaluator
from pyspark.ml.functions import array_to_vector
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blocksync.engine.config import ModelSpec
from blocksync.engine.driver.blocks import FEATURES, LABEL
from blocksync.engine.driver.input_columns import check_ids, packed_columns
from blocksync.engine.driver.spark_facts import is_connect
from blocksync.engine.inputs import IDS, inputs_of
from blocksync.engine.models import state_bytes
from blocksync.pipeline.artifacts import SavedModel


def score(spark: SparkSession, df: DataFrame, saved: SavedModel) -> DataFrame:
    """`df` (features, label) plus `prediction` and, for classification, `probability` (array<double>).
    With typed inputs, `df` holds their source columns: their ids are checked against the trained
    cardinalities first (an unseen category is an error), then packed as in training."""
    meta = saved.meta
    spec = inputs_of(meta)
    columns = [F.col(FEATURES)]
    if spec is not None:
        check_ids(df, spec)
        columns = list(packed_columns(df, spec))
    blob = state_bytes(saved.module)
    holder: Any = None if is_connect(spark) else spark.sparkContext.broadcast(blob)
    classification = saved.task == "classification"

    def scorer(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from blocksync.engine.inputs import inputs_of
        from blocksync.engine.models import module_from_bytes
        from blocksync.pipeline.artifacts import SavedModel

        module = module_from_bytes(ModelSpec(**meta["model"]), int(meta["num_features"]), int(meta["num_outputs"]),
                                   holder.value if holder is not None else blob, inputs_of(meta))
        model = SavedModel(module=module, meta=meta)
        for frame in frames:
            if frame.empty:
                continue
            x = np.stack(frame[FEATURES].to_numpy()).astype(np.float32).reshape(len(frame), -1)
            ids = np.stack(frame[IDS].to_numpy()).astype(np.int64).reshape(len(frame), -1) if IDS in frame else None
            out = model.outputs(x, ids)
            result = pd.DataFrame({LABEL: frame[LABEL].to_numpy(dtype=np.float64)})
            if classification:
                result["prediction"] = out.argmax(axis=1).astype(np.float64)
                result["probability"] = list(out)
            else:
                result["prediction"] = out
            yield result

    schema = f"{LABEL} double, prediction double" + (", probability array<double>" if classification else "")
    packed = [c.alias(name) for c, name in zip(columns, (FEATURES, IDS), strict=False)]
    return df.select(*packed, F.col(LABEL)).mapInPandas(scorer, schema)


def metrics(scored: DataFrame, task: str) -> dict[str, float]:
    """accuracy, F1 and log loss (classification) or RMSE and R2 (regression), via Spark ML evaluators."""
    if task == "classification":
        data = scored.withColumn("probability", array_to_vector(F.col("probability"))).cache()
        out = {}
        for name, metric in (("test_accuracy", "accuracy"), ("test_f1", "f1"), ("test_loss", "logLoss")):
            evaluator = MulticlassClassificationEvaluator(
                labelCol=LABEL, predictionCol="prediction", probabilityCol="probability", metricName=metric,  # type: ignore[arg-type]
            )
            out[name] = float(evaluator.evaluate(data))
        data.unpersist()
        return out
    out = {}
    for name, metric in (("test_rmse", "rmse"), ("test_r2", "r2"), ("test_loss", "mse")):
        out[name] = float(RegressionEvaluator(labelCol=LABEL, predictionCol="prediction", metricName=metric)  # type: ignore[arg-type]
                          .evaluate(scored))
    return out
