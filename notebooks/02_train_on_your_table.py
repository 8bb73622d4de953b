# Databricks notebook source
# MAGIC %md
# MAGIC # Train on your own table
# MAGIC
# MAGIC Set the widgets: the table, its feature columns (comma-separated; empty: every column but the label),
# MAGIC the label column, the number of workers and the collective backend. Classification labels may be
# MAGIC strings or numbers; set the task to `regression` for a numeric target.

# COMMAND ----------

from blocksync.pipeline.notebook import notebook_context, widget

# Databricks provides spark, dbutils and displayHTML; elsewhere: a local[4] session and the defaults.
spark, dbutils, display_html = notebook_context(globals())

table = widget(dbutils, "table", "main.default.training_table", "Table")
features = widget(dbutils, "features", "", "Feature columns (comma-separated, empty: all but label)")
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
config = load_config(None, [
    f"output_dir={output_dir}", "progress=false", "spark.master=null",
    f"data.source={table}", "data.format=table", f"data.features={json.dumps(feature_list or None)}",
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
print(model.task, model.labels, model.meta["feature_columns"])
