"""The engine: everything that runs the barrier stage, in three sides and the definitions they share.

- `driver/`: validate settings and the cluster, cut the blocks (`blocks`, or Parquet row ranges in
  `shards`), size where they are kept (`storage`), launch and relaunch the one barrier stage and
  assemble the result (`launcher`), and the run's metrics.
- `worker/`: what each barrier task runs: load its block (`block_store`, `shard_reader`), start up,
  and the BSP loop (`trainer`); the step-by-step protocol is in `worker.worker`.
- `comm/`: the collectives (horovod, torch_gloo, spark), gradient buckets and compression.
- this folder: the definitions both sides use (`config`, `plan`, `errors`, `models`, `losses`,
  `optim`, `inputs`, `checkpoint`, and `progress`/`last_words`, the worker-to-driver reports).

Each layer imports only those below it (shared < comm < worker < driver), and the engine imports
nothing from `blocksync.pipeline` or `blocksync.ml`, which are built on top of it
(`tests/test_layout.py` checks both, and that no modules import each other).
"""
