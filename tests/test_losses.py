"""User-defined losses (`loss: package.module:fn`): the same BSP equivalence, recovery and driver-side probe."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from blocksync import ModelSpec, TrainConfig, make_blocks, train, train_blocks
from blocksync.engine.losses import check_loss
from tests.conftest import synthetic_classification
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(300)

SMOOTHED = "tests.custom_losses:smoothed_cross_entropy"


def config(backend: str, **extra) -> TrainConfig:
    settings = dict(num_workers=3, backend=backend, epochs=3, batch_size=24, seed=2, check_every=4,
                    optimizer="adam", lr=0.02, model=ModelSpec(name="mlp", hidden=[8]), loss=SMOOTHED)
    return TrainConfig(**{**settings, **extra})


@pytest.fixture(scope="module")
def data(spark):
    return spark.createDataFrame(synthetic_classification(130, 6, 3, seed=4))


@pytest.mark.parametrize("backend", ["horovod", "torch_gloo", "spark"])
def test_a_custom_loss_trains_like_the_single_process_loop(spark, data, backend):
    cfg = config(backend, epochs=1 if backend == "spark" else 3)  # the spark backend: about 1 s a step
    blocks, info = make_blocks(data, features="features", label="label", num_workers=3, seed=5)
    result = train_blocks(spark, blocks, info, cfg)
    reference = reference_train(collect_blocks(blocks, 3), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    # The loss matters: plain cross-entropy on the same blocks ends elsewhere.
    plain = reference_train(collect_blocks(blocks, 3), TrainConfig(**{**cfg.to_dict(), "loss": None}), num_outputs=3)
    assert max_param_diff(result.model, plain) > 1e-3
    assert len({s["digest"] for s in result.rank_summaries}) == 1


@pytest.mark.parametrize("backend,weighted", [("horovod", False), ("torch_gloo", True)])
def test_label_smoothing_trains_like_the_single_process_loop(spark, backend, weighted):
    """The built-in cross-entropy with label_smoothing: the reference writes the smoothed target out."""
    pdf = synthetic_classification(130, 6, 3, seed=4)
    pdf["w"] = np.random.default_rng(4).integers(0, 5, len(pdf)) * 0.5
    cfg = config(backend, loss=None, label_smoothing=0.2)
    blocks, info = make_blocks(spark.createDataFrame(pdf), features="features", label="label", num_workers=3,
                               seed=5, weight="w" if weighted else None)
    result = train_blocks(spark, blocks, info, cfg)
    reference = reference_train(collect_blocks(blocks, 3), cfg, num_outputs=3)
    assert max_param_diff(result.model, reference) <= 1e-5
    plain = reference_train(collect_blocks(blocks, 3), TrainConfig(**{**cfg.to_dict(), "label_smoothing": 0.0}),
                            num_outputs=3)
    assert max_param_diff(result.model, plain) > 1e-3
    assert len({s["digest"] for s in result.rank_summaries}) == 1


def test_a_custom_regression_loss_matches_the_reference_and_survives_a_relaunch(spark, tmp_path):
    pdf = synthetic_classification(120, 6, 3, seed=6)
    pdf["target"] = pdf["features"].map(lambda f: float(np.sum(f[:3])))
    df = spark.createDataFrame(pdf)
    cfg = config("torch_gloo", task="regression", loss="tests.custom_losses:huber", blocks="shuffle")
    blocks, info = make_blocks(df, features="features", label="target", num_workers=3, seed=1)
    clean = train_blocks(spark, blocks, info, cfg)
    assert max_param_diff(clean.model, reference_train(collect_blocks(blocks, 3), cfg, num_outputs=1)) <= 1e-5
    faulty = train_blocks(spark, blocks, info, TrainConfig(**{
        **cfg.to_dict(), "max_restarts": 1, "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 4},
        "faults": {"kill_rank": 1, "at_step": 10, "mode": "raise"}}))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [8] * 3
    assert max_param_diff(clean.model, faulty.model) == 0.0
    assert faulty.history == clean.history


@pytest.mark.parametrize("name,message", [
    ("mean_cross_entropy", r"returns the mean over the batch's rows .*; return their sum \(e.g. reduction='sum'\)"),
    ("per_row_cross_entropy", r"returns \(6,\) for a batch of 6 rows; it must return one number, the loss summed"),
    ("constant", r"does not depend on the outputs"),
    ("nope", r"tests.custom_losses has no callable 'nope'"),
])
def test_a_loss_that_breaks_the_contract_is_refused_by_the_probe(name, message):
    with pytest.raises(ValueError, match=message):
        check_loss(f"tests.custom_losses:{name}", "classification", 3)


def test_bad_loss_settings_are_refused_before_any_stage(spark, data):
    with pytest.raises(ValueError, match=r"loss='torch' is not an import path 'package.module:fn'"):
        TrainConfig(loss="torch")
    with pytest.raises(ValueError, match=r"label_smoothing=0.1 applies to the built-in cross-entropy, and "
                                         r"loss='tests.custom_losses:smoothed_cross_entropy' replaces it"):
        config("torch_gloo", label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"label_smoothing=-0.1 must be in \[0, 1\)"):
        TrainConfig(label_smoothing=-0.1)
    with pytest.raises(ValueError, match=r"loss='no_such_pkg.mod:fn': cannot import 'no_such_pkg.mod'"):
        train(spark, data, config("torch_gloo", loss="no_such_pkg.mod:fn"))
    with pytest.raises(ValueError, match=r"returns the mean over the batch's rows"):
        train(spark, data, config("torch_gloo", loss="tests.custom_losses:mean_cross_entropy"))
    weighted = spark.createDataFrame(pd.DataFrame({"features": [[0.0, 1.0]] * 8, "label": [0, 1] * 4, "w": 1.0}))
    with pytest.raises(ValueError, match=r"with per-row weights: a custom loss sums its own rows"):
        train(spark, weighted, config("torch_gloo"), weight="w")


def test_label_smoothing_is_a_spark_ml_param_and_a_regressor_refuses_it():
    from blocksync.ml import BlockSyncClassifier, BlockSyncRegressor

    assert BlockSyncClassifier().getOrDefault("labelSmoothing") == 0.0
    cfg = BlockSyncClassifier(labelSmoothing=0.1).train_config("classification")
    assert cfg.label_smoothing == 0.1 and cfg.loss is None
    regressor = BlockSyncRegressor().setLabelSmoothing(0.1)
    with pytest.raises(ValueError, match=r"task='regression' has none: set label_smoothing=0"):
        regressor.train_config("regression")
