"""Settings checked before Spark starts: what would otherwise fail late, each error naming its setting.

Nothing here imports torch or the engine unless the settings name code or a store to check (a custom
model or loss, a checkpoint directory): for the built-in networks the CLI gets through its checks
without loading them, and loads them while the JVM starts (`blocksync.pipeline.cli`).
"""

from __future__ import annotations

from blocksync.engine.config import ModelSpec, is_custom
from blocksync.engine.driver.scan import pyarrow_opens
from blocksync.pipeline.run_config import RunConfig
from blocksync.pipeline.sources import is_uri


def check_settings(config: RunConfig) -> None:
    """The checkpoint store, a custom model's import path, the loss, and settings that do not go
    together. The output directory is checked through Spark's filesystem once the session is up
    (`stages.check_output_dir`)."""
    check_checkpoint_dir(config.train.checkpoint.dir)
    check_model(config.train.model)
    if config.data.inputs is not None and config.train.blocks == "files":
        raise ValueError("data.inputs with train.blocks=files: typed inputs are cut into blocks by Spark; set "
                         "train.blocks=shuffle (or auto).")
    if config.train.blocks == "files" and is_uri(config.output_dir) and not pyarrow_opens(config.output_dir):
        raise ValueError(f"train.blocks=files has the workers read the prepared Parquet through pyarrow, which "
                         f"has no filesystem for output_dir={config.output_dir!r}; set train.blocks=auto (Spark "
                         "cuts the blocks there) or put output_dir on a filesystem pyarrow reads.")
    if config.train.loss:
        from blocksync.engine.losses import import_loss

        import_loss(config.train.loss)


def check_model(spec: ModelSpec) -> None:
    """A custom `package.module:factory` must import and be callable; a built-in needs no check."""
    if is_custom(spec):
        from blocksync.engine.models import check_importable

        check_importable(spec)


def check_checkpoint_dir(uri: str | None) -> None:
    if not uri:
        return
    import pyarrow.fs as pafs

    from blocksync.engine.checkpoint import filesystem

    try:
        fs, root = filesystem(uri)
        info = fs.get_file_info(root)
    except Exception as err:  # pyarrow raises OSError, ValueError or ArrowException subclasses per filesystem
        raise ValueError(f"train.checkpoint.dir={uri!r} cannot be reached ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); fix the URI or its credentials.") from err
    if info.type == pafs.FileType.File:
        raise ValueError(f"train.checkpoint.dir={uri!r} is a file, not a directory; choose another checkpoint.dir.")
