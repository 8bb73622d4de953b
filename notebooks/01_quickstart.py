# Databricks notebook source
# MAGIC %md
# MAGIC # blocksync quickstart: train on digits with block-synchronous Horovod workers
# MAGIC
# MAGIC Spark cuts scikit-learn's digits into one block per worker; one barrier stage trains an MLP with
# MAGIC Horovod all-reduce every step; the model is scored by a Spark stage. Needs a cluster with at least
# MAGIC `num_workers` task slots and the blocksync wheel plus a Horovod build for its torch (see README).

# COMMAND ----------

from blocksync.pipeline.notebook import notebook_context, show_report, widget

# Databricks provides spark, dbutils and displayHTML; elsewhere: a local[4] session and the defaults.
spark, dbutils, display_html = notebook_context(globals())

output_dir = widget(dbutils, "output_dir", "/tmp/blocksync/quickstart", "Run directory")
num_workers = widget(dbutils, "num_workers", "4", "Workers")
epochs = widget(dbutils, "epochs", "30", "Epochs")

# COMMAND ----------

from blocksync.pipeline.stages import run
from blocksync.pipeline.run_config import load_config

# The settings of conf/local.yaml, spelled out (a notebook's working folder varies).
config = load_config(None, [
    f"output_dir={output_dir}", "progress=false", "spark.master=null", "data.source=digits",
    f"train.num_workers={num_workers}", f"train.epochs={epochs}", "train.backend=horovod",
    "train.model.hidden=[128, 64]", "train.batch_size=64", "train.lr=0.004", "train.weight_decay=1e-4",
    "train.label_smoothing=0.1",
])
metrics = run(spark, config, overwrite=True)
print(f"test accuracy {metrics['test_accuracy']:.4f}, samples/s {metrics['samples_per_sec']:.0f}, "
      f"sync fraction {metrics['sync_fraction']:.2f}")

# COMMAND ----------

# MAGIC %md
# MAGIC The report: loss per epoch, and per rank the time spent computing against the time in the all-reduce.

# COMMAND ----------

report_path = show_report(output_dir, display_html, spark=spark)
print(report_path)
