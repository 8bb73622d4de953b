"""The engine: everything that runs the barrier stage.

Driver side: `config` (TrainConfig), `blocks` and `shards` (cutting the data into
one block per rank), `launcher` (validate, launch, relaunch, assemble) and
`metrics`. Worker side: `worker` (the task function), `trainer` (the BSP loop),
`block_data`, `collectives`, `compression`, `checkpoint`, `models`, `optim`;
`progress` carries heartbeats from the workers to the driver's monitor.

The engine imports nothing from `blocksync.pipeline`: the pipeline (YAML runs,
CLI, artifacts) is built on top of it.
"""
