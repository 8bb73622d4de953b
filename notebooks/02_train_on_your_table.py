# Databricks notebook source
# MAGIC %md
# MAGIC # Train on your own table
# MAGIC
# MAGIC Set the widgets: the table, its feature columns (comma-separated; empty: every column but the label),
# MAGIC the label column, the number of workers and the collective backend. Classification labels may be
# MAGIC strings or numbers; set the task to `regression` for a numeric target.
# MAGIC
# MAGIC Categorical columns (a store, a country, a weekday) go in their own widget: each gets its own learned
# MAGIC embedding (model `embedding_mlp`) instead of being read as a number. String categories are indexed
# MAGIC first with Spark ML's `StringIndexer`; the other feature columns are the numeric input.

# COMMAND ----------

from blocksync.pipeline.notebook import notebook_context, widget

# Databricks provides spark, dbutils and displayHTML; elsewhere: a local[4] session and the defaults.
spark, dbutils, display_html = notebook_context(globals())

table = widget(dbutils, "table", "main.default.training_table", "Table")
features = widget(dbutils, "features", "", "Feature columns (comma-separated, empty: all but label)")
categorical = widget(dbutils, "categorical", "", "Categorical columns (comma-separated; strings are indexed)")
label = widget(dbutils, "label", "label", "Label column")
task = widget(dbutils, "task", "classification", "classification or regression")
num_workers = widget(dbutils, "num_workers", "4", "Workers")
backend = widget(dbutils, "backend", "horovod", "horovod, torch_gloo or spark")
epochs = widget(dbutils, "epochs", "10", "Epochs")
output_dir = widget(dbutils, "output_dir", "/tmp/blocksync/your-table", "Run directory")

# COMMAND ----------

import json

from blocksync.pipeline.stages import run
from blocksync.pipeline.run_config import load_config

feature_list = [c.strip() for c in features.split(",") if c.strip()]
categorical_list = [c.strip() for c in categorical.split(",") if c.strip()]
source, data_settings = table, [f"data.features={json.dumps(feature_list or None)}"]
if categorical_list:
    from pyspark.ml.feature import StringIndexer

    df = spark.table(table)
    strings = [c for c, kind in df.dtypes if c in categorical_list and kind == "string"]
    indexer = None
    if strings:  # keep `indexer`: new rows to score need the same codes
        indexer = StringIndexer(inputCols=strings, outputCols=[f"{c}__code" for c in strings]).fit(df)
        df = indexer.transform(df).drop(*strings)
        for c in strings:
            df = df.withColumnRenamed(f"{c}__code", c)
    df.createOrReplaceTempView("blocksync_indexed_table")
    numeric = feature_list or [c for c in df.columns if c != label and c not in categorical_list]
    inputs = [{"name": c, "kind": "categorical"} for c in categorical_list]
    inputs += [{"name": "numeric", "columns": numeric}] if numeric else []
    source = "blocksync_indexed_table"
    data_settings = [f"data.inputs={json.dumps(inputs)}", "data.standardize=false", "train.model.name=embedding_mlp"]
config = load_config(None, [
    f"output_dir={output_dir}", "progress=false", "spark.master=null",
    f"data.source={source}", "data.format=table", *data_settings,
    f"data.label={label}", f"train.task={task}", f"train.num_workers={num_workers}",
    f"train.backend={backend}", f"train.epochs={epochs}",
])
metrics = run(spark, config, overwrite=True)
print(json.dumps({k: v for k, v in metrics.items() if k.startswith("test_")}, indent=1))

# COMMAND ----------

# MAGIC %md
# MAGIC Score new rows with the saved model: on the driver with `load_model`, or on the cluster with the scoring stage.

# COMMAND ----------

from blocksync import load_model

model = load_model(output_dir)
print(model.task, model.labels, model.meta["feature_columns"] or model.meta["inputs"])
