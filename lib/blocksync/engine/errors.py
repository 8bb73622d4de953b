"""The engine's exception types, in a module that imports nothing heavy: the CLI catches them before
it has loaded torch and the engine (it starts the JVM first; see `blocksync.pipeline.cli`)."""


class TrainingError(RuntimeError):
    """The barrier stage failed; the message carries the worker's own error and rank.

    `kind` is `input` when the cause is the user's data or settings (a rank's
    ValueError, the executors' Python environment): the CLI exits 2 for it and
    the launcher does not relaunch. Otherwise `runtime` (exit 1).
    """

    def __init__(self, message: str, kind: str = "runtime") -> None:
        super().__init__(message)
        self.kind = kind


class CollectiveError(RuntimeError):
    """A collective backend could not start or failed."""
