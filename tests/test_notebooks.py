"""Every notebook, top to bottom, the way Databricks runs it: cells in order, `spark` and `dbutils` predefined."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from blocksync.pipeline.datasets import digits_frame

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
pytestmark = pytest.mark.timeout(600)


class FakeWidgets:
    """dbutils.widgets with preset values (what a user types into the widgets)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.created: list[str] = []

    def text(self, name: str, default: str, label: str = "") -> None:
        self.created.append(name)
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        return self.values[name]


class FakeDbutils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = FakeWidgets(values)


def run_notebook(name: str, spark, widgets: dict[str, str]) -> dict:
    text = (NOTEBOOKS / name).read_text()
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("\n# COMMAND ----------\n")
    shown: list[str] = []
    namespace = {"spark": spark, "dbutils": FakeDbutils(widgets), "displayHTML": shown.append,
                 "__name__": "__main__"}
    code_cells = 0
    for i, cell in enumerate(cells):
        lines = [ln for ln in cell.splitlines() if ln.strip() and ln != "# Databricks notebook source"]
        if all(ln.startswith("# MAGIC") for ln in lines):
            continue  # a %md cell
        code_cells += 1
        exec(compile(cell, f"{name} cell {i}", "exec"), namespace)  # noqa: S102 (the notebook under test)
    assert code_cells >= 2
    namespace["_shown"] = shown
    return namespace


def test_01_quickstart(spark, tmp_path):
    ns = run_notebook("01_quickstart.py", spark, {"output_dir": str(tmp_path / "quick"), "epochs": "12"})
    assert ns["metrics"]["test_accuracy"] >= 0.95
    assert ns["_shown"] and ns["_shown"][0].startswith('<img src="data:image/png;base64,')
    assert ns["report_path"] == str(tmp_path / "quick" / "report.png")
    assert set(ns["dbutils"].widgets.created) == {"output_dir", "num_workers", "epochs"}


def test_02_train_on_your_table(spark, tmp_path):
    digits = digits_frame(spark).withColumn("digit", F.concat(F.lit("d"), F.col("label").cast("string"))).drop("label")
    digits.createOrReplaceTempView("notebook_digits")
    ns = run_notebook("02_train_on_your_table.py", spark, {
        "table": "notebook_digits", "label": "digit", "backend": "torch_gloo", "epochs": "8",
        "output_dir": str(tmp_path / "table"),
    })
    assert ns["metrics"]["test_accuracy"] >= 0.9
    assert ns["model"].labels == [f"d{i}" for i in range(10)]  # string classes, mapping saved
    assert len(ns["model"].meta["feature_columns"]) == 64


def test_02_with_a_categorical_column(spark, tmp_path):
    """The shop table (blocksync.pipeline.datasets.shop_table) with string stores and classes: the notebook
    indexes the stores and trains an embedding per store and weekday; reading the codes as numbers cannot
    learn the per-store effects (an MLP on them is the baseline)."""
    from blocksync.pipeline.datasets import shop_table

    pdf = shop_table(3000, seed=0)
    pdf["store"] = "store-" + pdf["store"].astype(str)
    pdf["level"] = pdf.pop("label").map({0: "low", 1: "usual", 2: "high"})
    spark.createDataFrame(pdf).createOrReplaceTempView("notebook_shop")
    widgets = {"table": "notebook_shop", "label": "level", "backend": "torch_gloo", "epochs": "12"}
    ns = run_notebook("02_train_on_your_table.py", spark, {
        **widgets, "categorical": "store, weekday", "output_dir": str(tmp_path / "shop")})
    assert [(i["name"], i["kind"], i["cardinality"]) for i in ns["model"].meta["inputs"]] == [
        ("store", "categorical", 40), ("weekday", "categorical", 7), ("numeric", "numeric", None)]
    assert ns["model"].meta["inputs"][2]["columns"] == ["price", "discount"]
    spark.createDataFrame(pdf.assign(store=pdf["store"].str.slice(6).astype(int))).createOrReplaceTempView(
        "notebook_shop_codes")
    baseline = run_notebook("02_train_on_your_table.py", spark, {
        **widgets, "table": "notebook_shop_codes", "output_dir": str(tmp_path / "codes")})
    assert ns["metrics"]["test_accuracy"] >= baseline["metrics"]["test_accuracy"] + 0.1


def test_03_compression_and_monitoring(spark, tmp_path):
    ns = run_notebook("03_compression_and_monitoring.py", spark, {
        "output_root": str(tmp_path / "cmp"), "epochs": "3", "modes": "none,topk",
    })
    table = ns["comparison"].set_index("compression")
    assert list(table.index) == ["none", "topk"]
    # Exact bytes per rank and step for the 64-128-64-10 MLP (17226 parameters): float32, and top-k with the
    # default ratio 0.01 (k = 173 int32 indices + float16 values).
    num_params = (64 * 128 + 128) + (128 * 64 + 64) + (64 * 10 + 10)
    assert table.loc["none", "payload_bytes_per_step"] == 4 * num_params == 68904
    assert table.loc["topk", "payload_bytes_per_step"] == math.ceil(0.01 * num_params) * (4 + 2) == 1038
    assert ns["straggler_metrics"]["stragglers"] == [2]
    assert (tmp_path / "cmp" / "straggler" / "timeline.json").exists()


def test_04_spark_ml_pipeline(spark, tmp_path):
    digits = digits_frame(spark).withColumn("digit", F.concat(F.lit("d"), F.col("label").cast("string"))).drop("label")
    digits.createOrReplaceTempView("notebook_digits_ml")
    ns = run_notebook("04_spark_ml_pipeline.py", spark, {
        "table": "notebook_digits_ml", "label": "digit", "epochs": "4", "learning_rates": "0.00001,0.01",
        "model_path": str(tmp_path / "pipeline-model"),
    })
    assert len(ns["columns"]) == 64
    low, high = ns["tuned"].avgMetrics
    assert high > 0.9 and low < high  # a learning rate of 1e-5 barely moves in 4 epochs
    assert ns["tuned"].bestModel.stages[-1].getOrDefault("lr") == 0.01
    assert ns["new_accuracy"] > 0.9
    assert (tmp_path / "pipeline-model" / "stages").is_dir()
