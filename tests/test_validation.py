"""Validation during training: held-out rows, per-epoch validation loss, early stopping, best weights."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark.sql import functions as F

from blocksync import TrainConfig, train
from blocksync.ml import BlockSyncClassifier
from tests.reference import summed_loss

pytestmark = pytest.mark.timeout(400)


def noisy_table(spark, n: int = 600, seed: int = 4):
    """Few rows, many noisy features and flipped labels: a wide MLP overfits them within a few epochs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 20)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    flip = rng.random(n) < 0.2
    y[flip] = 1 - y[flip]
    table = pd.DataFrame({"features": list(x), "label": y, "held": np.arange(n) % 4 == 0})
    return spark.createDataFrame(table), x[table["held"]], y[table["held"]]


def held_out_loss(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, smoothing: float = 0.0
                  ) -> tuple[float, float]:
    """Mean cross-entropy (against targets smoothed by `smoothing`, by the reference's written-out formula) and
    accuracy of `model` on the held-out rows, computed here in one pass."""
    with torch.no_grad():
        out = model(torch.from_numpy(x)).double()
    loss = summed_loss(out, torch.from_numpy(y), "classification", smoothing=smoothing) / len(y)
    return float(loss), float((out.argmax(1).numpy() == y).mean())


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_the_validation_loss_is_the_held_out_rows_loss_of_the_model(spark, smoothing):
    df, x_held, y_held = noisy_table(spark)
    model = BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=3, batchSize=64, lr=0.01,
                                model={"name": "mlp", "hidden": [16]}, validationIndicatorCol="held",
                                labelSmoothing=smoothing).fit(df)
    assert [sorted(e) for e in model.history] == [["epoch", "step", "train_accuracy", "train_loss",
                                                   "val_accuracy", "val_loss"]] * 3
    loss, accuracy = held_out_loss(model.torchModule(), x_held, y_held, smoothing)
    assert model.history[-1]["val_loss"] == pytest.approx(loss, rel=1e-5)
    if smoothing:  # the smoothed loss is not the plain one
        assert abs(held_out_loss(model.torchModule(), x_held, y_held)[0] - loss) > 1e-3
    assert model.history[-1]["val_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    # Held-out rows never train: the steps count only the other 450 rows (2 workers, batch 64: 8 steps).
    assert model.history[0]["step"] == 8


def test_early_stopping_stops_every_rank_at_the_same_epoch_with_the_best_weights(spark):
    df, x_held, y_held = noisy_table(spark)
    config = TrainConfig(num_workers=3, backend="horovod", epochs=40, batch_size=32, lr=0.02, seed=1,
                         model={"name": "mlp", "hidden": [256, 256]}, early_stopping_patience=3)
    result = train(spark, df, config, validation="held")
    losses = [e["val_loss"] for e in result.history]
    best = int(np.argmin(losses))
    assert len(losses) < 40 and len(losses) - 1 - best == 3, losses  # stopped 3 epochs after the best
    assert {s["epochs_run"] for s in result.rank_summaries} == {len(losses)}
    assert len({s["digest"] for s in result.rank_summaries}) == 1
    # 450 training rows in global batches of 32: 15 steps an epoch, and only the epochs that ran.
    assert result.metrics["epochs"] == len(losses) and result.metrics["steps"] == len(losses) * 15
    # The returned weights are the best epoch's, not the last: their held-out loss is the lowest one.
    assert held_out_loss(result.model, x_held, y_held)[0] == pytest.approx(losses[best], rel=1e-5)
    assert losses[-1] > losses[best]


def test_a_validation_fraction_holds_rows_out_and_bad_settings_are_named(spark):
    df, _, _ = noisy_table(spark)
    config = TrainConfig(num_workers=2, backend="torch_gloo", epochs=1, batch_size=64, validation_fraction=0.25,
                         model={"name": "logreg"})
    result = train(spark, df, config)
    assert 0.2 * 600 < 600 - sum(result.block_sizes) < 0.3 * 600
    assert "val_loss" in result.history[0]
    with pytest.raises(ValueError, match="use one of them"):
        train(spark, df, config, validation="held")
    with pytest.raises(ValueError, match="early_stopping_patience=2 needs validation rows"):
        train(spark, df, TrainConfig(num_workers=2, early_stopping_patience=2))
    with pytest.raises(ValueError, match="validation column 'nope' not in the DataFrame"):
        train(spark, df, TrainConfig(num_workers=2), validation="nope")
    with pytest.raises(ValueError, match="validation column 'features' is array<float>; it must be boolean"):
        train(spark, df, TrainConfig(num_workers=2), validation="features")
    with pytest.raises(ValueError, match="validation column 'none_held' holds out no rows"):
        train(spark, df.withColumn("none_held", F.lit(False)), TrainConfig(num_workers=2), validation="none_held")
    with pytest.raises(ValueError, match="validation column 'some_null' has nulls"):
        nulls = df.withColumn("some_null", F.when(F.col("held"), F.lit(True)))
        train(spark, nulls, TrainConfig(num_workers=2), validation="some_null")
    with pytest.raises(ValueError, match="early_stopping_patience needs sync=gradients"):
        TrainConfig(sync="parameters", sync_every=2, early_stopping_patience=2)
    with pytest.raises(ValueError, match="set blocks=shuffle"):
        TrainConfig(blocks="files", validation_fraction=0.1)
