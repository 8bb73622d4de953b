"""Saving and loading fitted models through Spark's own filesystem layer.

A model path holds `weights/` (Parquet: the safetensors bytes of the weights
in ordered chunks) and `metadata/` (Spark ML's DefaultParamsWriter JSON: class,
uid, Params, plus `blocksync`: the network spec, widths, task and history).
Both are written with DataFrame writers, so they go wherever Spark's writers
go (local, hdfs://, s3a://, dbfs:/; tested on local paths), on classic Spark
and on Spark Connect, and
`PipelineModel.save`/`load` treat the model like any MLlib stage.

Metadata is written last: a save that fails part-way is removed, and a folder
without metadata never loads. Loading reads weights and JSON only (never
unpickles code); a network named by an import path `package.module:factory` is
built by importing that module, which must be importable on the driver and the
executors.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.ml import Model
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter
from pyspark.sql import SparkSession

from blocksync.engine.models import check_importable, is_custom
from blocksync.engine.saved_model import damaged, network, spec_of


class PersistedModel(Model):
    """What the writer needs of a fitted model, and the base `ml.model.BlockSyncModelBase` extends: its
    Params, the safetensors bytes of its weights and its metadata."""

    _weights: bytes
    _meta: dict[str, Any]

log = logging.getLogger(__name__)

FORMAT = "blocksync-ml-model/1"
UNWRITABLE = ("ParentNotDirectoryException", "AccessControlException", "AccessDeniedException")
"""Hadoop's errors for a path that cannot be made (under a file, no permission): the caller's to fix."""
CHUNK_BYTES = 8 * 1024 * 1024


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether `path` exists, asked through Spark's filesystem layer (classic and Connect alike)."""
    try:
        spark.read.format("binaryFile").load(path).schema  # noqa: B018 (resolving the relation lists the path)
    except AnalysisException as err:
        if "PATH_NOT_FOUND" in str(err) or "Path does not exist" in str(err):
            return False
        raise
    return True


def remove_path(spark: SparkSession, path: str) -> None:
    from pyspark.ml.util import _remove_dfs_dir  # pyspark's own recursive delete, classic and Connect

    _remove_dfs_dir(path, spark)


class ModelWriter(MLWriter):
    """`model.write().save(path)`; `.overwrite()` replaces what is at `path`."""

    def __init__(self, instance: PersistedModel) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        spark = self.sparkSession
        if path_exists(spark, path):
            if not self.shouldOverwrite:
                raise FileExistsError(f"{path} already exists; call .write().overwrite().save(path) to replace it, "
                                      "or save to another path.")
            remove_path(spark, path)
        try:
            self.saveImpl(path)
        except BaseException as err:
            if path_exists(spark, path):
                remove_path(spark, path)  # nothing half-written
            cause = root_cause(err)
            if cause.split(":")[0] in UNWRITABLE:
                raise ValueError(f"{path} cannot be written ({cause}); save to another path.") from err
            raise

    def saveImpl(self, path: str) -> None:
        spark, model = self.sparkSession, self.instance
        blob = model._weights
        chunks = [(i, blob[start : start + CHUNK_BYTES]) for i, start in enumerate(range(0, len(blob), CHUNK_BYTES))]
        spark.createDataFrame(chunks, "chunk int, data binary").coalesce(1).write.parquet(f"{path}/weights")
        DefaultParamsWriter.saveMetadata(model, path, spark, extraMetadata={"blocksync": {**model._meta,
                                                                                         "format": FORMAT}})


class ModelReader(MLReader):
    """`BlockSyncClassificationModel.load(path)`, and what `PipelineModel.load` calls for the stage."""

    def __init__(self, cls: type[Any]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        spark = self.sparkSession
        metadata = load_metadata(spark, path)
        meta = metadata.get("blocksync")
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or metadata.get("class") != expected:
            raise ValueError(f"{path} holds a {metadata.get('class')}, not a {expected}; load it with its own class.")
        spec = spec_of(meta, f"{path}/metadata")
        if is_custom(spec):
            log.warning("%s: the network is built by importing %s", path, spec.name)
            check_importable(spec)
        weights = _weights(spark, path)
        network(meta, weights, f"{path}/metadata", f"{path}/weights")  # checked here, not on the executors
        model = self.cls(weights, _meta_of(meta))
        model._resetUid(metadata["uid"])
        try:
            DefaultParamsReader.getAndSetParams(model, metadata)
        except (TypeError, ValueError) as err:  # an edited Param value: the converters refuse it
            raise damaged(f"{path}/metadata", f"{type(err).__name__}: {err}") from err
        return model


def root_cause(err: BaseException) -> str:
    """The innermost cause of a failure, one line: for a Java error (a checksum, a Parquet footer) the Java
    exception's own class and message, not Py4J's wrapping."""
    java = getattr(err, "java_exception", None)
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    kind, text = (java.getClass().getSimpleName(), str(java.getMessage() or "")) if java is not None else (
        type(err).__name__, str(err))
    lines = text.strip().splitlines()
    return f"{kind}: {lines[0][:300] if lines else ''}"


def load_metadata(spark: SparkSession, path: str) -> dict[str, Any]:
    """Spark ML's metadata of the model saved at `path`; a ValueError naming the path when there is none, or
    naming the file when it is not Spark ML's JSON."""
    try:
        metadata = DefaultParamsReader.loadMetadata(path, spark)
    except AnalysisException as err:
        raise ValueError(f"{path} holds no saved Spark ML model (no readable metadata/); give the path a "
                         "BlockSync model or a PipelineModel was saved to.") from err
    except Exception as err:  # not JSON, JSON without Spark ML's keys, a failed checksum (Spark's own types)
        raise damaged(f"{path}/metadata", root_cause(err)) from err
    if not isinstance(metadata, dict) or not isinstance(metadata.get("class"), str):
        raise damaged(f"{path}/metadata", "no model class in it")
    return metadata


def _weights(spark: SparkSession, path: str) -> bytes:
    """The safetensors bytes in `path/weights`: Parquet rows (chunk, data), joined in chunk order."""
    try:
        rows = spark.read.parquet(f"{path}/weights").orderBy("chunk").collect()
        chunks = [int(r["chunk"]) for r in rows]
        blob = b"".join(bytes(r["data"]) for r in rows)
    except Exception as err:  # a missing, truncated or foreign Parquet file (Spark's own exception types)
        raise damaged(f"{path}/weights", root_cause(err)) from err
    if chunks != list(range(len(chunks))):
        raise damaged(f"{path}/weights", f"chunks {chunks[:8]} are not 0..{len(chunks) - 1}")
    return blob


def _meta_of(saved: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in saved.items() if k != "format"}
