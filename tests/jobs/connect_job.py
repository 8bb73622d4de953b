"""Train and score on a Spark Connect session (`SparkSession.builder.remote("local[4]")`); write what happened."""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
from job_report import run_and_report
from pyspark.sql import SparkSession

from blocksync import ModelSpec, TrainConfig, train, train_files
from blocksync.ml import BlockSyncClassificationModel, BlockSyncClassifier
from blocksync.pipeline.artifacts import SavedModel
from blocksync.pipeline.evaluate import metrics, score


def job(spark: SparkSession) -> dict:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 600)
    x = rng.normal(size=(600, 8)).astype(np.float32) + 2 * labels[:, None]
    df = spark.createDataFrame(pd.DataFrame({"features": list(x), "label": labels.astype(np.int64)}))
    result = train(spark, df, TrainConfig(num_workers=4, backend="horovod", epochs=5, batch_size=50, lr=0.05,
                                          model=ModelSpec(name="logreg")))
    saved = SavedModel(module=result.model, meta={
        "task": "classification", "model": {"name": "logreg", "hidden": [], "dropout": 0.0,
                                            "image_shape": None, "options": {}},
        "num_features": 8, "num_outputs": 3, "mean": None, "std": None,
    })
    scored = metrics(score(spark, df, saved), "classification")
    with tempfile.TemporaryDirectory() as folder:  # blocks=files: the workers read the Parquet themselves
        pd.DataFrame({"features": list(x), "label": labels}).to_parquet(f"{folder}/data.parquet")
        runs = {storage: train_files(spark, f"{folder}/data.parquet", TrainConfig(
            num_workers=2, backend="torch_gloo", epochs=2, batch_size=50, lr=0.05, block_storage=storage,
            model=ModelSpec(name="logreg"))) for storage in ("memory", "disk")}
    from_files = runs["disk"]
    return {
        **spark_ml(spark, df),
        "files_block_sizes": from_files.block_sizes,
        "files_digests": sorted({s["digest"] for s in from_files.rank_summaries}),
        "files_memory_digests": sorted({s["digest"] for s in runs["memory"].rank_summaries}),
        "files_storage": from_files.metrics["block_storage"],
        "session": type(spark).__module__,
        "block_sizes": result.block_sizes,
        "digests": sorted({s["digest"] for s in result.rank_summaries}),
        "accuracy": scored["test_accuracy"],
    }


def spark_ml(spark: SparkSession, df) -> dict:
    """The Spark ML estimator on Connect: fit, transform, evaluate, save and load back."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    model = BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=5, batchSize=50, lr=0.05,
                                model={"name": "logreg"}).fit(df)
    scored = model.transform(df)
    with tempfile.TemporaryDirectory() as folder:
        model.write().save(f"{folder}/model")
        loaded = BlockSyncClassificationModel.load(f"{folder}/model")
        again = loaded.transform(df).select("probability").collect()
    return {
        "ml_columns": scored.columns,
        "ml_accuracy": MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored),
        "ml_round_trip": [r.probability for r in scored.select("probability").collect()] == [
            r.probability for r in again],
    }


if __name__ == "__main__":
    run_and_report(lambda: SparkSession.builder.remote("local[4]").getOrCreate(), job)
