"""`blocksync predict`: score new, unlabeled data on the executors with a trained model.

    blocksync predict --model runs/local --input new.parquet --output scored.parquet

`--model` is either
- a CLI run directory (or its `model/` folder): the input needs the run's raw
  feature columns; the saved standardization is applied in Spark exactly as the
  prepare stage did, and `prediction` holds the original label values; or
- a path a blocksync Spark ML model or a PipelineModel was saved to: its own
  stages prepare the features.

Either way scoring is the Spark ML model's `transform` (predict_batch_udf, the
network built once per Python worker), every input column is kept (ids
included), and `prediction` plus, for classifiers, `probability` (an array of
doubles) are appended. The output path is checked before any scoring.
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import AnalysisException
from pyspark.ml.functions import vector_to_array
from pyspark.ml.util import DefaultParamsReader
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from blocksync.engine.driver.blocks import features_column
from blocksync.engine.models import state_bytes
from blocksync.engine.saved_model import damaged
from blocksync.ml.model import (
    BlockSyncClassificationModel,
    BlockSyncModelBase,
    BlockSyncRegressionModel,
    invalid_values,
    raised_by_check,
    reject,
)
from blocksync.ml.persistence import load_metadata, root_cause
from blocksync.pipeline.artifacts import META, load_model_from
from blocksync.pipeline.leftovers import StagedOutput, sweep
from blocksync.pipeline.outputs import check_output, read_root, refuse_overlap
from blocksync.pipeline.prepare import standardized
from blocksync.pipeline.run_files import RunFiles
from blocksync.pipeline.sources import read_path_or_table

PREPARED = "__blocksync_features"


def run_model(files: RunFiles, *, trust_custom_code: bool) -> tuple[BlockSyncModelBase, dict[str, Any]]:
    """A CLI run's model as a Spark ML model, and its model.json (feature columns, standardization, labels)."""
    saved = load_model_from(files, trust_custom_code=trust_custom_code)  # checks files, weights and trust
    meta = saved.meta
    columns = meta.get("feature_columns")
    names = isinstance(columns, str) or isinstance(columns, list) and all(isinstance(c, str) for c in columns)
    if not meta.get("inputs") and not names:  # typed inputs name their own columns (`inputs`), not these
        raise damaged(f"{META} in {files.display()}", f"feature_columns={columns!r}: not column names")
    cls = BlockSyncClassificationModel if meta["task"] == "classification" else BlockSyncRegressionModel
    spec = {k: meta.get(k) for k in ("model", "num_features", "num_outputs", "task", "inputs")}
    model = cls(state_bytes(saved.module), spec)  # the loaded network's tensors: a remote model is read once
    model.setFeaturesCol(PREPARED)
    if isinstance(model, BlockSyncClassificationModel):
        model._set(rawPredictionCol="")  # predict writes prediction and probability only
    return model, meta


def _run_features(df: DataFrame, meta: dict[str, Any]) -> Column:
    columns = meta["feature_columns"]
    try:
        x = features_column(df, columns)
    except ValueError as err:
        raise ValueError(f"--input does not fit this model: {err}") from err
    x = reject(invalid_values(x), f"a row has a null, NaN or infinite value in feature column(s) {columns}; "
               "the model scores numbers only: fill or drop those rows first", x)
    return standardized(x, meta["mean"], meta["std"]) if meta.get("mean") is not None else x


def _original_labels(prediction: Column, labels: list[Any] | None) -> Column:
    if labels is None:
        return prediction
    return F.element_at(F.array(*[F.lit(v) for v in labels]), prediction.cast("int") + 1)


def score_new_data(spark: SparkSession, model_path: str, df: DataFrame, *, trust_custom_code: bool = False
                   ) -> DataFrame:
    """`df` with every column kept, plus `prediction` and (classifiers) `probability` as array<double>."""
    files = RunFiles(spark, model_path, setting="--model")
    if files.exists(META) or files.exists(f"model/{META}"):
        model, meta = run_model(files, trust_custom_code=trust_custom_code)
        if meta.get("inputs"):  # typed inputs: transform reads their own columns
            scored = model.transform(df)
        else:
            scored = model.transform(df.withColumn(PREPARED, _run_features(df, meta))).drop(PREPARED)
        scored = scored.withColumn("prediction", _original_labels(F.col("prediction"), meta.get("labels")))
    else:
        scored = _spark_ml_model(spark, model_path).transform(df)
    if "rawPrediction" in scored.columns and "rawPrediction" not in df.columns:
        scored = scored.drop("rawPrediction")
    if "probability" in scored.columns and "probability" not in df.columns:
        scored = scored.withColumn("probability", vector_to_array(F.col("probability")))
    return scored


def _spark_ml_model(spark: SparkSession, path: str) -> Any:
    try:
        metadata = DefaultParamsReader.loadMetadata(path, spark)
    except AnalysisException as err:  # a missing path or a folder without Spark ML metadata
        raise ValueError(f"--model {path} is neither a blocksync run (model/{META}) nor a saved Spark ML model "
                         "(metadata/); give a run directory or a path a model was saved to.") from err
    except Exception:  # noqa: BLE001 (a damaged metadata/: load_metadata says which file and why)
        metadata = load_metadata(spark, path)
    if metadata["class"] == "pyspark.ml.pipeline.PipelineModel":
        from pyspark.ml import PipelineModel

        return PipelineModel.load(path)
    cls = {c.__module__ + "." + c.__name__: c for c in (BlockSyncClassificationModel, BlockSyncRegressionModel)}
    if metadata["class"] not in cls:
        raise ValueError(f"--model {path} holds a {metadata['class']}; give a blocksync model or a PipelineModel.")
    return cls[metadata["class"]].load(path)


def predict(spark: SparkSession, model: str, source: str, output: str, *, overwrite: bool = False,
            trust_custom_code: bool = False) -> int:
    """Score `source` (Parquet/CSV path or table) with `model`; write Parquet to `output`; return the row count.

    `output` is checked first (`outputs`: writable, not existing unless `overwrite`, not over `--input` or
    `--model`), then the rows are scored into a staging folder beside it and renamed into place: a failed
    or stopped scoring (a bad row, a full disk) leaves nothing at `output`, and an output replaced with
    `overwrite` is kept until the new one is complete.
    """
    target = RunFiles(spark, output, setting="--output")
    sweep(target)
    check_output(target, overwrite=overwrite)
    reads = {"--input": read_root(spark, source, "--input"), "--model": RunFiles(spark, model, setting="--model").root}
    refuse_overlap(target, {k: v for k, v in reads.items() if v})
    df = read_path_or_table(spark, source, "auto", setting="--input")
    scored = score_new_data(spark, model, df, trust_custom_code=trust_custom_code)
    with StagedOutput(target) as staged:
        try:
            scored.write.parquet(staged.uri())
        except Exception as err:
            raised = raised_by_check(err)  # a row failed a check in the query (null features, width)
            if raised is not None:
                raise ValueError(f"--input: {raised}") from err
            raise OSError(f"writing the scored rows to --output {target.display()} failed ({root_cause(err)}); "
                          "nothing was left there") from err
        rows = int(spark.read.parquet(staged.uri()).count())
        staged.commit(overwrite=overwrite)
    return rows
