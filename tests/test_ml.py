"""The Spark ML API: BlockSyncClassifier/Regressor in Pipelines and tuners, transform, persistence, bad input."""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator, RegressionEvaluator
from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.ml.util import DefaultParamsWriter
from safetensors.numpy import load as load_numpy

from blocksync import ModelSpec, TrainConfig, train
from blocksync.ml import BlockSyncClassificationModel, BlockSyncClassifier, BlockSyncRegressor
from blocksync.ml.estimator import SlotGate
from blocksync.pipeline.artifacts import model_meta, save_model
from blocksync.pipeline.predict import score_new_data

pytestmark = pytest.mark.timeout(600)

COLUMNS = [f"x{i}" for i in range(5)]
COMMON = {"numWorkers": 2, "backend": "torch_gloo", "batchSize": 64, "seed": 3}


def species_table(n: int, seed: int) -> pd.DataFrame:
    """Two seeded Gaussian blobs in 5 raw (unscaled) columns, a string class and an id."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = np.where(y[:, None] == 1, 2.0, -2.0) * np.array([1, 0.5, 0, -1, 0.25]) + rng.normal(0, 1.5, (n, 5))
    table = pd.DataFrame(x * np.array([1, 10, 100, 0.1, 3]) + 7, columns=COLUMNS)
    return table.assign(species=np.where(y == 1, "setosa", "virginica"), id=np.arange(n))


@pytest.fixture(scope="module")
def species(spark):
    return spark.createDataFrame(species_table(1200, seed=0)).cache()


@pytest.fixture(scope="module")
def tuned(spark, species, tmp_path_factory):
    """VectorAssembler + StringIndexer + StandardScaler + classifier, tuned by TrainValidationSplit."""
    clf = BlockSyncClassifier(**COMMON, epochs=4, model={"name": "mlp", "hidden": [8]})
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=COLUMNS, outputCol="raw"),
                                StringIndexer(inputCol="species", outputCol="label"),
                                StandardScaler(inputCol="raw", outputCol="features"), clf])
    grid = ParamGridBuilder().addGrid(clf.lr, [0.01, 0.03]).build()
    tvs = TrainValidationSplit(estimator=pipeline, estimatorParamMaps=grid, trainRatio=0.75, seed=1,
                               evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    return tvs.fit(species)


def mlp_reference(weights: bytes, features: np.ndarray) -> np.ndarray:
    """Logits of a one-hidden-layer ReLU MLP in float64 numpy, from the saved tensors alone."""
    w = load_numpy(weights)
    hidden = np.maximum(features @ w["0.weight"].T.astype(np.float64) + w["0.bias"], 0)
    return hidden @ w["2.weight"].T.astype(np.float64) + w["2.bias"]


def test_a_tuned_pipeline_scores_every_row_like_its_network(tuned, species):
    pipeline_model = tuned.bestModel
    model = pipeline_model.stages[-1]
    assert isinstance(model, BlockSyncClassificationModel) and model.numClasses == 2 and model.numFeatures == 5
    assert model.getOrDefault("lr") in (0.01, 0.03) and len(model.history) == 4
    scored = pipeline_model.transform(species)
    # Every input column is kept; the outputs are appended, the vectors as Spark ML vectors.
    assert scored.columns == [*species.columns, "raw", "label", "features", "prediction", "rawPrediction",
                              "probability"]
    types = {f.name: f.dataType for f in scored.schema.fields}
    assert isinstance(types["rawPrediction"], VectorUDT) and isinstance(types["probability"], VectorUDT)
    rows = scored.orderBy("id").collect()
    logits = mlp_reference(model._weights, np.array([r.features.toArray() for r in rows]))
    raw = np.array([r.rawPrediction.toArray() for r in rows])
    np.testing.assert_allclose(raw, logits, atol=1e-5)
    expected_p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.array([r.probability.toArray() for r in rows]), expected_p, atol=1e-6)
    assert [r.prediction for r in rows] == logits.argmax(axis=1).astype(float).tolist()
    # The MLlib evaluators read the output as it is.
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    auc = BinaryClassificationEvaluator().evaluate(scored)
    assert accuracy > 0.9 and auc > 0.95, (accuracy, auc)
    assert max(tuned.validationMetrics) > 0.9


def test_a_saved_pipeline_loads_and_predicts_bit_for_bit(spark, tuned, species, tmp_path):
    path = str(tmp_path / "pipeline")
    tuned.bestModel.save(path)
    loaded = PipelineModel.load(path)
    assert isinstance(loaded.stages[-1], BlockSyncClassificationModel)
    assert loaded.stages[-1].getOrDefault("lr") == tuned.bestModel.stages[-1].getOrDefault("lr")
    columns = ["prediction", "rawPrediction", "probability"]
    before = [tuple(r) for r in tuned.bestModel.transform(species).orderBy("id").select(columns).collect()]
    after = [tuple(r) for r in loaded.transform(species).orderBy("id").select(columns).collect()]
    assert after == before
    # The estimator persists too, with every Param (dicts included).
    clf = BlockSyncClassifier(**COMMON, model={"name": "mlp", "hidden": [8]}, checkpoint={"dir": "/tmp/c"}, lr=0.2)
    clf.save(str(tmp_path / "estimator"))
    again = BlockSyncClassifier.load(str(tmp_path / "estimator"))
    assert {p.name: v for p, v in again.extractParamMap().items()} == {
        p.name: v for p, v in clf.extractParamMap().items()}
    # `blocksync predict` takes the saved pipeline too: its own stages prepare the features.
    new_rows = species.drop("species")
    scored = score_new_data(spark, path, new_rows).orderBy("id")
    assert scored.columns == [*new_rows.columns, "raw", "features", "prediction", "probability"]
    assert [r.prediction for r in scored.collect()] == [r[0] for r in before]


def test_predict_scores_a_cli_run_model_with_its_standardization_and_labels(spark, species, tmp_path):
    """A run directory (model/ as the CLI writes it, here a logistic regression with known weights): predict
    standardizes the raw columns, scores, and maps class indices back to the run's string labels."""
    torch.manual_seed(0)
    module = torch.nn.Linear(5, 2)
    mean, std = [7.0, 7.0, 7.0, 7.0, 7.0], [2.0, 20.0, 150.0, 0.3, 6.0]
    meta = model_meta(ModelSpec(name="logreg"), 5, 2, {"task": "classification", "feature_columns": COLUMNS,
                      "label_column": "species", "labels": ["setosa", "virginica"], "mean": mean, "std": std})
    save_model(tmp_path / "run" / "model", module, meta)
    scored = score_new_data(spark, str(tmp_path / "run"), species).orderBy("id").toPandas()
    assert list(scored.columns) == [*species.columns, "prediction", "probability"]
    x = (scored[COLUMNS].to_numpy() - np.array(mean)) / np.array(std)
    logits = x @ module.weight.detach().double().numpy().T + module.bias.detach().double().numpy()
    assert scored["prediction"].tolist() == np.array(["setosa", "virginica"])[logits.argmax(1)].tolist()
    # An input without the run's feature columns, and a --model that is no model, are named.
    with pytest.raises(ValueError, match=r"--input does not fit this model: feature column\(s\) \['x4'\] not in"):
        score_new_data(spark, str(tmp_path / "run"), species.drop("x4"))
    with pytest.raises(ValueError, match="is neither a blocksync run"):
        score_new_data(spark, str(tmp_path / "nothing"), species)


def regression_table(spark, n: int = 1000):
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (n, 5))
    y = x @ np.array([1.5, -2.0, 0.5, 0.0, 1.0]) + 0.1 * rng.normal(0, 1, n)
    return spark.createDataFrame(pd.DataFrame(x, columns=COLUMNS).assign(target=y)).cache()


def test_cross_validator_skips_the_lr_that_diverges(spark):
    """SGD on a linear model past its stability bound: the loss grows every epoch (finite, so the fit
    completes), the RMSE is huge, and CrossValidator picks the stable rate. The folds run two at a time."""
    df = regression_table(spark)
    reg = BlockSyncRegressor(**COMMON, epochs=3, optimizer="sgd", momentum=0.0, featuresCols=COLUMNS,
                             labelCol="target", model={"name": "logreg"})
    grid = ParamGridBuilder().addGrid(reg.lr, [1.6, 0.1]).build()
    cv = CrossValidator(estimator=reg, estimatorParamMaps=grid, numFolds=2, parallelism=2, seed=2,
                        evaluator=RegressionEvaluator(labelCol="target", metricName="rmse"),
                        collectSubModels=True).fit(df)
    diverged, stable = cv.subModels[0]
    assert diverged.history[-1]["train_loss"] > 100 * diverged.history[0]["train_loss"]  # it really diverged
    assert stable.history[-1]["train_loss"] < 0.1
    assert cv.avgMetrics[0] > 100 * cv.avgMetrics[1]
    assert cv.bestModel.getOrDefault("lr") == 0.1
    # fit is train(): the refit best model holds exactly the weights train() gives for the same settings.
    config = TrainConfig(task="regression", num_workers=2, backend="torch_gloo", batch_size=64, seed=3, epochs=3,
                         optimizer="sgd", momentum=0.0, lr=0.1, model={"name": "logreg"})
    reference = train(spark, df, config, features=COLUMNS, label="target").model.state_dict()
    fitted = cv.bestModel.torchModule().state_dict()
    assert all(bool((fitted[k] == v).all()) for k, v in reference.items())


def test_parallel_fits_that_would_overrun_the_slots_take_turns(caplog):
    gate, running, peak = SlotGate(), [], []

    def fit() -> None:
        with gate.hold(3, slots=4):
            running.append(1)
            peak.append(len(running))
            time.sleep(0.3)
            running.pop()

    threads = [threading.Thread(target=fit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(peak) == 1 and gate.held == 0
    assert "it needs 3 task slots (numWorkers) and 3 of the cluster's 4 are held" in caplog.text
    with gate.hold(2, slots=4), gate.hold(2, slots=4):  # two that fit run together
        assert gate.held == 4


def test_bad_input_is_named_and_nothing_is_half_written(spark, tuned, species, tmp_path, monkeypatch):
    model = tuned.bestModel.stages[-1]
    # A features column of the wrong type, or the wrong width.
    with pytest.raises(ValueError, match="species"):
        model.copy({model.featuresCol: "species"}).transform(species)
    narrow = VectorAssembler(inputCols=COLUMNS[:3], outputCol="features").transform(species)
    with pytest.raises(Exception, match="featuresCol 'features' has 3 values in a row; this model was trained on 5"):
        model.transform(narrow).collect()
    # Labels that are not class indices.
    with pytest.raises(ValueError, match="class indices"):
        BlockSyncClassifier(**COMMON, featuresCols=COLUMNS[1:], labelCol="x0").fit(species)
    # Settings: an unknown Param, a bad value (refused when set, before fit), a bad model dict.
    with pytest.raises(ValueError, match=r"no Param\(s\) \['learningRate'\]"):
        BlockSyncClassifier(learningRate=0.1)
    with pytest.raises(ValueError, match="lr=-1.0 must be > 0"):
        BlockSyncClassifier(lr=-1.0).fit(species)
    with pytest.raises(TypeError, match="hiden"):
        BlockSyncClassifier(model={"name": "mlp", "hiden": [3]})
    # Saving onto an existing path without overwrite() leaves it as it was.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"overwrite\(\)"):
        model.write().save(str(taken))
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    model.write().overwrite().save(str(taken))
    assert BlockSyncClassificationModel.load(str(taken)).numFeatures == 5
    # A save that fails after the weights are written leaves nothing at the path.
    def broken_metadata(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(DefaultParamsWriter, "saveMetadata", broken_metadata)
    with pytest.raises(OSError, match="disk full"):
        model.write().save(str(tmp_path / "half"))
    assert not (tmp_path / "half").exists()
    monkeypatch.undo()
    # Loading what is not a blocksync model.
    with pytest.raises(ValueError, match="holds no saved Spark ML model"):
        BlockSyncClassificationModel.load(str(tmp_path / "nothing-here"))
    indexer_path = str(tmp_path / "indexer")
    tuned.bestModel.stages[1].save(indexer_path)
    with pytest.raises(ValueError, match="holds a org.apache.spark.ml.feature.StringIndexerModel"):
        BlockSyncClassificationModel.load(indexer_path)
