"""The engine: everything that runs the barrier stage.

Driver side: `config` (TrainConfig), `blocks` and `shards` (cutting the data into
one block per rank), `scan` (is a DataFrame only Parquet files?), `storage` (block
sizes: memory or disk), `input_columns` (typed inputs' checks), `launcher`
(validate, launch, relaunch, assemble) and `metrics`. Worker side: `worker` (the
task function), `startup` (phases before the first step), `block_store` (a block
in memory or on local disk), `trainer` (the BSP loop), `block_data`,
`collectives`, `compression`, `checkpoint`, `models`, `losses`, `optim`, `inputs`;
`progress` carries heartbeats from the workers to the driver's monitor, and
`last_words` a dead rank's stderr.

The engine imports nothing from `blocksync.pipeline`: the pipeline (YAML runs,
CLI, artifacts) is built on top of it.
"""
