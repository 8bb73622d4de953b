"""Worker side: the function each barrier task runs, its block storage and readers, and the BSP loop.

The step-by-step synchronization protocol is in `worker`."""
