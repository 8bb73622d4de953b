# Databricks notebook source
# MAGIC %md
# MAGIC # Compression and monitoring compared
# MAGIC
# MAGIC The same digits run with each gradient compression mode: test accuracy, bytes each rank contributes
# MAGIC per step, and the share of step time spent in the collective. Then a run with an injected straggler,
# MAGIC which the timing report names.

# COMMAND ----------

from blocksync.pipeline.notebook import notebook_context, widget

# Databricks provides spark, dbutils and displayHTML; elsewhere: a local[4] session and the defaults.
spark, dbutils, display_html = notebook_context(globals())

output_root = widget(dbutils, "output_root", "/tmp/blocksync/compression", "Folder for the runs")
epochs = widget(dbutils, "epochs", "20", "Epochs")
modes = widget(dbutils, "modes", "none,fp16,topk,int8", "Compression modes")

# COMMAND ----------

import pandas as pd

from blocksync.pipeline.stages import run
from blocksync.pipeline.run_config import load_config

rows = []
for mode in [m.strip() for m in modes.split(",") if m.strip()]:
    config = load_config(None, [
        f"output_dir={output_root}/{mode}", "progress=false", "spark.master=null", "data.source=digits",
        "train.model.hidden=[128, 64]", "train.batch_size=64", "train.lr=0.004", "train.weight_decay=1e-4",
        "train.label_smoothing=0.1", f"train.epochs={epochs}", f"train.compression={mode}",
    ])
    m = run(spark, config, overwrite=True)
    rows.append({"compression": mode, "test_accuracy": m["test_accuracy"],
                 "payload_bytes_per_step": m["payload_bytes_per_step"], "sync_fraction": m["sync_fraction"]})
comparison = pd.DataFrame(rows)
print(comparison.to_string(index=False))

# COMMAND ----------

# MAGIC %md
# MAGIC A straggler: rank 2 sleeps 30 ms in every compute phase. The report lists it, and the other ranks' sync
# MAGIC time grows by the same amount (they wait for it inside the all-reduce).

# COMMAND ----------

config = load_config(None, [
    f"output_dir={output_root}/straggler", "progress=false", "spark.master=null", "train.epochs=2",
    "train.backend=torch_gloo", "train.faults.slow_rank=2", "train.faults.slow_ms=30",
])
straggler_metrics = run(spark, config, overwrite=True)
print("stragglers:", straggler_metrics["stragglers"])
print(pd.DataFrame(straggler_metrics["timing"]).T[["compute_p50_ms", "sync_p50_ms"]])
print(f"timeline for Perfetto / chrome://tracing: {output_root}/straggler/timeline.json")
