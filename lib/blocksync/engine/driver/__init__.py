"""Driver side of the barrier stage: checks, the block cut, shards, storage, launch, relaunch, metrics.

The protocol, from the driver's point of view, is in `launcher`."""
