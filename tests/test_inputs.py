"""Typed inputs (numeric, tokens, categorical), the embedding_mlp and transformer models, and their checks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from blocksync import Input, ModelSpec, TrainConfig, TrainingError, make_blocks, train, train_blocks
from blocksync.engine.driver.input_columns import check_ids, resolve_inputs
from blocksync.pipeline.datasets import shop_table
from tests.helpers import collect_typed_blocks
from tests.reference import max_param_diff, reference_train

pytestmark = pytest.mark.timeout(300)

SHOP_INPUTS = [{"name": "store", "kind": "categorical"}, {"name": "weekday", "kind": "categorical", "cardinality": 7},
               {"name": "num", "columns": ["price", "discount"]}]
SHOP_LAYOUT = [("store", "categorical", 1), ("weekday", "categorical", 1), ("num", "numeric", 2)]
TOKEN_INPUTS = [Input("seq", "tokens", cardinality=12, pad=0)]
TOKEN_LAYOUT = [("seq", "tokens", 10)]
SMALL_TRANSFORMER = {"d_model": 16, "heads": 2, "layers": 1, "dim_feedforward": 24}


def token_table(rows: int, seed: int) -> pd.DataFrame:
    """Sequences of 3 to 10 tokens from 1..11, padded with 0 to length 10; label: does 5 occur (1) or not (0)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 11, rows)
    seqs = [np.pad(rng.integers(1, 12, n), (0, 10 - n)) for n in lengths]
    return pd.DataFrame({"seq": [s.astype(np.int64) for s in seqs], "label": [int(5 in s) for s in seqs]})


def weighted_shop(rows: int, seed: int) -> pd.DataFrame:
    """shop_table with row weights 0 to 2 (a weight of 0: the row does not count)."""
    return shop_table(rows, seed).assign(w=np.random.default_rng(seed).integers(0, 5, rows) * 0.5)


def config(backend: str, model: ModelSpec, **extra) -> TrainConfig:
    settings = dict(num_workers=3, backend=backend, epochs=2, batch_size=24, seed=4, check_every=4,
                    optimizer="adam", lr=0.01, model=model, blocks="shuffle")
    return TrainConfig(**{**settings, **extra})


CASES = {
    "embedding_mlp": (weighted_shop, SHOP_INPUTS, SHOP_LAYOUT, 3, ModelSpec(name="embedding_mlp", hidden=[8]),
                      None, {}),
    # The transformer case also takes a custom loss (label smoothing and class weights, summed). It steps with
    # SGD: the gradient of attention's key bias is zero in exact arithmetic (softmax ignores a shift), so
    # both sides hold rounding noise there, which Adam's normalization turns into full-size steps.
    "transformer": (token_table, TOKEN_INPUTS, TOKEN_LAYOUT, 2,
                    ModelSpec(name="transformer", options=SMALL_TRANSFORMER),
                    "tests.custom_losses:smoothed_cross_entropy", {"optimizer": "sgd", "momentum": 0.9, "lr": 0.05}),
}


@pytest.mark.parametrize("backend", ["horovod", "torch_gloo", "spark"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_typed_inputs_train_like_the_single_process_reference(spark, backend, case):
    table, inputs, layout, classes, model, loss, optimizer = CASES[case]
    df = spark.createDataFrame(table(100, seed=5))
    cfg = config(backend, model, loss=loss, epochs=1 if backend == "spark" else 2, **optimizer)  # spark: ~1 s a step
    spec = resolve_inputs(df, inputs)
    weight = "w" if "w" in df.columns else None  # a custom loss (the transformer case) takes no row weights
    blocks, info = make_blocks(df, label="label", num_workers=3, seed=1, inputs=spec, weight=weight)
    result = train_blocks(spark, blocks, info, cfg)
    described = [(i.name, i.kind, i.width, i.cardinality, i.pad) for i in result.inputs.inputs]
    reference = reference_train(collect_typed_blocks(blocks, 3, layout), cfg, classes, described)
    assert max_param_diff(result.model, reference) <= 1e-5
    assert len({s["digest"] for s in result.rank_summaries}) == 1


def test_the_driver_measures_cardinalities_and_ids_stay_int64_end_to_end(spark):
    pdf = shop_table(90, seed=2)
    # Codes above 2**24 cannot survive float32 (2**24 + 1 rounds to 2**24): they must arrive exact.
    pdf["big"] = np.int64(2**40) + np.arange(len(pdf)) * (2**24 + 1) + 1
    df = spark.createDataFrame(pdf)
    spec = resolve_inputs(df, [*SHOP_INPUTS, {"name": "big", "kind": "tokens", "columns": ["big"]}])
    assert [(i.name, i.width, i.cardinality) for i in spec.inputs] == [
        ("store", 1, int(pdf["store"].max()) + 1), ("weekday", 1, 7), ("num", 2, None),
        ("big", 1, int(pdf["big"].max()) + 1)]
    blocks, _ = make_blocks(df, label="label", num_workers=3, seed=0, inputs=spec)
    assert [f.dataType.simpleString() for f in blocks.schema.fields] == ["array<float>", "array<bigint>", "double"]
    parts = collect_typed_blocks(blocks, 3, [*SHOP_LAYOUT, ("big", "tokens", 1)])
    got = sorted(int(v) for p in parts for v in p[0]["big"][:, 0])
    assert got == sorted(pdf["big"].tolist())
    rows = {(int(s), int(w), float(np.float32(p)))
            for s, w, p in zip(pdf["store"], pdf["weekday"], pdf["price"], strict=True)}
    assert {(int(s), int(w), float(n[0])) for p in parts
            for s, w, n in zip(p[0]["store"], p[0]["weekday"], p[0]["num"], strict=True)} == rows
    # The model receives them as int64 too: this factory's network refuses anything else.
    cfg = config("torch_gloo", ModelSpec(name="tests.custom_models:codes_and_numbers"), num_workers=2, epochs=1)
    result = train(spark, spark.createDataFrame(shop_table(60, seed=1)), cfg, label="label", inputs=SHOP_INPUTS)
    assert result.model.tables["store"].num_embeddings == result.inputs.inputs[0].cardinality


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_killed_worker_resumes_bitwise_and_disk_blocks_match_memory(spark, tmp_path, case):
    table, inputs, _, _, model, loss, optimizer = CASES[case]
    df = spark.createDataFrame(table(150, seed=8))
    weight = "w" if "w" in df.columns else None
    clean = train(spark, df, config("torch_gloo", model, epochs=3, loss=loss, **optimizer), label="label",
                  inputs=inputs, weight=weight)
    faulty = train(spark, df, config("torch_gloo", model, epochs=3, loss=loss, **optimizer, block_storage="disk",
                                     memory_budget_mb=1, max_restarts=1,
                                     checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 4},
                                     faults={"kill_rank": 1, "at_step": 10, "mode": "raise"}),
                   label="label", inputs=inputs, weight=weight)
    assert faulty.metrics["block_storage"] == "disk"
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [8] * 3
    assert max_param_diff(clean.model, faulty.model) == 0.0
    assert faulty.history == clean.history


def test_typed_inputs_with_validation_rows(spark):
    df = spark.createDataFrame(token_table(160, seed=3))
    cfg = config("torch_gloo", ModelSpec(name="transformer", options=SMALL_TRANSFORMER), validation_fraction=0.25,
                 epochs=3, early_stopping_patience=2)
    result = train(spark, df, cfg, label="label", inputs=TOKEN_INPUTS)
    assert all("val_loss" in e and "val_accuracy" in e for e in result.history)
    assert sum(result.block_sizes) < 160


def test_bad_typed_inputs_are_one_line_errors_on_the_driver(spark):
    shop = spark.createDataFrame(shop_table(80, seed=1))
    tokens = token_table(40, seed=1)
    with pytest.raises(ValueError, match=r"^inputs\['seq'\]: token id 11 is outside the vocabulary of 11 "
                                         r"\(cardinality\)"):
        resolve_inputs(spark.createDataFrame(tokens), [{"name": "seq", "kind": "tokens", "cardinality": 11}])
    with pytest.raises(ValueError, match=r"^inputs\['weekday'\]: category 6 was not seen by its cardinality=5 "
                                         r"\(categories 0..4\); unseen categories are an error"):
        resolve_inputs(shop, [{"name": "weekday", "kind": "categorical", "cardinality": 5}])
    trained = resolve_inputs(shop.filter("weekday < 6"), SHOP_INPUTS[:1] + [{"name": "weekday", "kind": "categorical"}])
    with pytest.raises(ValueError, match=r"^inputs\['weekday'\]: category 6 was not seen in training "
                                         r"\(categories 0..5\)"):
        check_ids(shop, trained)
    ragged = tokens.assign(seq=[s[: 3 + i % 4] for i, s in enumerate(tokens["seq"])])
    with pytest.raises(ValueError, match=r"^inputs\['seq'\]: arrays of ragged length \(3 to 6 values\); every row "
                                         r"needs the same length: pad them to one length \(and set its pad id\)"):
        resolve_inputs(spark.createDataFrame(ragged), TOKEN_INPUTS)
    with pytest.raises(ValueError, match=r"^inputs\['price'\]: 80 rows hold non-integer values"):
        resolve_inputs(shop, [{"name": "price", "kind": "categorical"}])
    negative = shop_table(30, seed=1).assign(store=lambda d: d["store"] - 5)
    with pytest.raises(ValueError, match=r"^inputs\['store'\]: category -\d is negative"):
        resolve_inputs(spark.createDataFrame(negative), SHOP_INPUTS[:1])
    named = shop_table(30, seed=1).assign(store=lambda d: "s" + d["store"].astype(str))
    with pytest.raises(ValueError, match=r"which are not numeric \(index strings first, e.g. with "
                                         r"pyspark.ml.feature.StringIndexer\)"):
        resolve_inputs(spark.createDataFrame(named), SHOP_INPUTS[:1])
    with pytest.raises(ValueError, match=r"inputs\['nope'\] reads column\(s\) \['nope'\] that the DataFrame lacks"):
        resolve_inputs(shop, [{"name": "nope"}])
    with pytest.raises(ValueError, match=r"inputs\[0\] has unknown key\(s\) \['vocab'\]"):
        resolve_inputs(shop, [{"name": "store", "kind": "tokens", "vocab": 40}])
    with pytest.raises(ValueError, match=r"inputs\['seq'\]: pad=12 is outside the vocabulary of 12"):
        resolve_inputs(spark.createDataFrame(tokens), [Input("seq", "tokens", cardinality=12, pad=12)])
    with pytest.raises(ValueError, match=r"inputs\['seq'\].cardinality=12.5 must be a whole number"):
        resolve_inputs(spark.createDataFrame(tokens), [{"name": "seq", "kind": "tokens", "cardinality": 12.5}])
    check_ids(shop.limit(0), trained)  # no rows to score: nothing to refuse (a raise fails the test)


def test_models_and_inputs_that_do_not_fit_are_refused_before_launch(spark):
    shop = spark.createDataFrame(shop_table(60, seed=1))
    with pytest.raises(ValueError, match=r"model.name='mlp' reads one float feature matrix, but typed inputs "
                                         r"were given"):
        train(spark, shop, config("torch_gloo", ModelSpec(name="mlp")), label="label", inputs=SHOP_INPUTS)
    with pytest.raises(ValueError, match=r"model.name='embedding_mlp' reads typed inputs; name them"):
        train(spark, spark.createDataFrame(token_table(60, 1)).selectExpr("transform(seq, x -> float(x)) AS features",
                                                                           "label"),
              config("torch_gloo", ModelSpec(name="embedding_mlp")), label="label")
    with pytest.raises(ValueError, match=r"model 'transformer' reads exactly one tokens input"):
        train(spark, shop, config("torch_gloo", ModelSpec(name="transformer")), label="label", inputs=SHOP_INPUTS)
    with pytest.raises(ValueError, match=r"both features=\['price'\] and inputs were given"):
        train(spark, shop, config("torch_gloo", ModelSpec(name="embedding_mlp")), features=["price"], label="label",
              inputs=SHOP_INPUTS)
    tokens = spark.createDataFrame(token_table(40, 1))
    with pytest.raises(ValueError, match=r"model.options=\{'d_modle': 8\} do not fit model 'transformer' .*; its "
                                         r"options are d_model, heads, layers, dim_feedforward"):
        train(spark, tokens, config("torch_gloo", ModelSpec(name="transformer", options={"d_modle": 8})),
              label="label", inputs=TOKEN_INPUTS)
    with pytest.raises(ValueError, match=r"model.options=\{'d_model': 30, 'heads': 4\} do not fit model 'transformer' "
                                         r"\(embed_dim must be divisible by num_heads\)"):
        train(spark, tokens, config("torch_gloo", ModelSpec(name="transformer", options={"d_model": 30, "heads": 4})),
              label="label", inputs=TOKEN_INPUTS)
    with pytest.raises(ValueError, match=r"the label column 'label' is also read by inputs\['all'\]"):
        train(spark, shop, config("torch_gloo", ModelSpec(name="embedding_mlp")), label="label",
              inputs=[{"name": "all", "columns": ["price", "label"]}])


def test_the_digits_tokens_config_runs_evaluates_and_predicts(spark, tmp_path):
    """conf/digits_tokens.yaml (one epoch): prepare measures the inputs, training and evaluation read them, and
    `blocksync predict` scores raw digits rows exactly as a hand-built dict of int64 pixels through the network."""
    import torch

    from blocksync import load_model
    from blocksync.pipeline.datasets import digits_frame
    from blocksync.pipeline.predict import score_new_data
    from blocksync.pipeline.run_config import load_config
    from blocksync.pipeline.stages import run

    config = load_config("conf/digits_tokens.yaml", [f"output_dir={tmp_path / 'run'}", "progress=false",
                                                      "train.epochs=1", "train.backend=torch_gloo"])
    metrics = run(spark, config)
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["test_loss"] > 0
    prepared = json.loads((tmp_path / "run" / "prepared" / "prepare.json").read_text())
    assert prepared["inputs"] == [{"name": "pixels", "kind": "tokens", "columns": "pixel_*", "cardinality": 17,
                                   "pad": None, "width": 64}]
    raw = digits_frame(spark).limit(50)
    scored = score_new_data(spark, str(tmp_path / "run"), raw, trust_custom_code=False).toPandas()
    pixels = torch.tensor(scored[[f"pixel_{i}" for i in range(64)]].to_numpy().astype(np.int64))
    module = load_model(tmp_path / "run").module
    with torch.no_grad():
        expected = module({"pixels": pixels}).argmax(1).numpy()
    assert (scored["prediction"].to_numpy() == expected).all()
    unseen = raw.withColumn("pixel_5", raw["pixel_5"] + 17)
    with pytest.raises(ValueError, match=r"inputs\['pixels'\]: token id \d+ is outside the vocabulary of 17"):
        score_new_data(spark, str(tmp_path / "run"), unseen)


def test_the_estimator_takes_the_same_input_specs(spark, tmp_path):
    """A Pipeline indexes a string column, the estimator trains on typed inputs bit for bit like `train`, the
    fitted pipeline saves, loads and scores like the network on a hand-built dict, and refuses a new city."""
    import torch
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StringIndexer

    from blocksync.ml import BlockSyncClassifier

    pdf = shop_table(120, seed=6)
    pdf["city"] = np.array(["oslo", "rome", "lima", "kyiv"])[pdf["store"] % 4]
    df = spark.createDataFrame(pdf)
    inputs = [{"name": "city_code", "kind": "categorical"}, *SHOP_INPUTS]
    cfg = config("torch_gloo", ModelSpec(name="embedding_mlp", hidden=[8]), num_workers=2, blocks="auto")
    indexed = StringIndexer(inputCol="city", outputCol="city_code").fit(df)
    expected = train(spark, indexed.transform(df), cfg, label="label", inputs=inputs).model.state_dict()
    estimator = BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=2, batchSize=24, seed=4, checkEvery=4,
                                    optimizer="adam", lr=0.01, model={"name": "embedding_mlp", "hidden": [8]},
                                    inputs=inputs)
    fitted = Pipeline(stages=[StringIndexer(inputCol="city", outputCol="city_code"), estimator]).fit(df)
    got = fitted.stages[-1].torchModule().state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    fitted.write().save(str(tmp_path / "pipeline"))
    scored = PipelineModel.load(str(tmp_path / "pipeline")).transform(df).toPandas()
    parts = {"city_code": torch.tensor(scored["city_code"].to_numpy().astype(np.int64)),
             "store": torch.tensor(scored["store"].to_numpy()), "weekday": torch.tensor(scored["weekday"].to_numpy()),
             "num": torch.tensor(scored[["price", "discount"]].to_numpy().astype(np.float32))}
    with torch.no_grad():
        logits = fitted.stages[-1].torchModule()(parts).double().numpy()
    assert np.allclose(np.stack(scored["rawPrediction"].map(lambda v: v.toArray())), logits, atol=1e-6)
    assert (scored["prediction"].to_numpy() == logits.argmax(1)).all()
    assert fitted.transform(df.limit(0)).count() == 0  # an empty table scores to an empty table
    new_store = spark.createDataFrame(pdf.assign(store=pdf["store"] + 100))
    with pytest.raises(ValueError, match=r"inputs\['store'\]: category \d+ was not seen in training"):
        fitted.transform(new_store)


def test_blocks_whose_ids_exceed_the_spec_stop_every_rank_with_an_input_error(spark):
    """train_blocks takes blocks as they are: a spec that understates a cardinality (the driver's check
    skipped) is caught by every worker before the first step, as bad input naming the problem."""
    from dataclasses import replace

    from blocksync.engine.inputs import InputSpec

    df = spark.createDataFrame(shop_table(60, seed=3))
    spec = resolve_inputs(df, SHOP_INPUTS)
    lying = InputSpec(tuple(replace(i, cardinality=3) if i.name == "store" else i for i in spec.inputs))
    blocks, info = make_blocks(df, label="label", num_workers=2, seed=0, inputs=lying)
    with pytest.raises(TrainingError, match=r"rows hold ids outside their inputs' cardinalities") as err:
        train_blocks(spark, blocks, info, config("torch_gloo", ModelSpec(name="embedding_mlp", hidden=[4]),
                                                  num_workers=2))
    assert err.value.kind == "input"
