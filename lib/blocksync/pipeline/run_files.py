"""A run directory reached through Spark's own filesystem layer: Hadoop's FileSystem, on the driver's JVM.

Spark writes a run's Parquet (prepared data, predictions) with its DataFrame writers. The driver writes its own
files (model, metrics, history, report) through this class, that is through the same Hadoop FileSystem, with
the same configuration and credentials. So `output_dir` may be anything Spark writes to: a local path,
`file:/`, `hdfs://`, `s3a://`, `dbfs:/`, `sftp://` (tested: an SSH server on loopback). A path without a
scheme means what it means to Spark's writers: the driver's working directory when the default filesystem is
the local disk (local mode, standalone clusters without HDFS), otherwise a path on `fs.defaultFS` (HDFS on
YARN clusters, DBFS on Databricks).

The driver makes its files in a local temporary folder and copies them up (`upload`); each stage then renames
what it made into place (`move_into_place`), so a failed stage leaves no half-written entry behind. On the
local disk and on HDFS a rename is atomic; on object stores it is a copy, as it is for Spark's own commits.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from blocksync.pipeline.sources import is_uri

log = logging.getLogger(__name__)


def java_message(err: Py4JJavaError) -> str:
    """The Java exception's class and first message line, not its stack trace."""
    cause = err.java_exception
    message = str(cause.getMessage() or "").splitlines()
    return f"{cause.getClass().getSimpleName()}: {message[0] if message else ''}".strip()


class RunFiles:
    """Files under one directory (`root`), named by paths relative to it ("" is the directory itself)."""

    def __init__(self, spark: SparkSession, root: str | os.PathLike[str], *, setting: str = "output_dir") -> None:
        """`setting` names the path in errors: output_dir, or predict's --model."""
        jvm: Any = getattr(spark, "_jvm", None)
        if jvm is None:
            raise ValueError("the pipeline stages write the run directory through Spark's JVM, which a Spark "
                             "Connect session does not expose; run them on classic Spark (spark-submit, "
                             "blocksync run), or use the estimators, which save through DataFrame writers.")
        conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self._jvm: Any = jvm
        text = os.fspath(root)
        if not str(text).strip():
            raise ValueError(f"{setting} is empty; name the run directory, e.g. output_dir=runs/local.")
        default_local = jvm.org.apache.hadoop.fs.FileSystem.getDefaultUri(conf).getScheme() in (None, "file")
        if not is_uri(text) and default_local:
            text = os.path.abspath(text)  # as the driver's Python sees it, whatever the JVM's cwd
        path = jvm.org.apache.hadoop.fs.Path(text)
        try:
            fs = path.getFileSystem(conf)
        except Py4JJavaError as err:
            raise ValueError(f"{setting}={text!r}: no filesystem for it ({java_message(err)}); check the scheme "
                             "and Spark's filesystem settings (spark.hadoop.fs.<scheme>.impl).") from err
        if fs.getUri().getScheme() == "file":
            fs = fs.getRawFileSystem()  # no .crc files beside the driver's files
        self._bind(fs, fs.makeQualified(path))
        try:  # the first call that talks to the store: an address or credentials problem is a setting's
            fs.exists(self._root)
        except Py4JJavaError as err:
            raise ValueError(f"{setting}={text!r} cannot be reached ({java_message(err)}); check its address "
                             "and credentials.") from err

    def _bind(self, fs: Any, root: Any) -> None:
        self._fs = fs
        self._root = root
        self.root = str(root)
        self.local: Path | None = Path(root.toUri().getPath()) if root.toUri().getScheme() == "file" else None

    def _path(self, name: str) -> Any:
        return self._root if not name else self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def uri(self, name: str = "") -> str:
        """Where `name` is, for Spark's readers and writers."""
        return str(self._path(name))

    def display(self, name: str = "") -> str:
        """Where `name` is, for people: a plain path on the local disk, else the URI."""
        if self.local is not None:
            return str(self.local / name) if name else str(self.local)
        return self.uri(name)

    def exists(self, name: str = "") -> bool:
        return bool(self._fs.exists(self._path(name)))

    def is_file(self, name: str = "") -> bool:
        return self.exists(name) and bool(self._fs.getFileStatus(self._path(name)).isFile())

    def read_bytes(self, name: str) -> bytes:
        stream = self._fs.open(self._path(name))
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def write_text(self, name: str, text: str) -> None:
        stream = self._fs.create(self._path(name), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def upload(self, local: Path, name: str, *, overwrite: bool = False) -> None:
        """Copy a local file or folder to `name` (which must not exist, unless `overwrite` and a file)."""
        source = self._jvm.org.apache.hadoop.fs.Path(local.resolve().as_uri())
        self._fs.copyFromLocalFile(False, overwrite, source, self._path(name))

    def download(self, name: str, local: Path) -> Path:
        """Copy `name` (a file or folder) to the local path `local`; return it."""
        target = self._jvm.org.apache.hadoop.fs.Path(local.resolve().as_uri())
        self._fs.copyToLocalFile(False, self._path(name), target, True)
        return local

    def mkdirs(self, name: str = "") -> None:
        if not self._fs.mkdirs(self._path(name)):
            raise OSError(f"{self.display(name)} could not be made")

    def delete(self, name: str) -> None:
        self._fs.delete(self._path(name), True)

    def discard(self, name: str) -> None:
        """Delete `name` if it is there; a failure is logged, not raised: clean-up must not hide the error
        that led to it."""
        try:
            self.delete(name)
        except Py4JJavaError as err:
            log.warning("could not remove %s: %s", self.display(name), java_message(err))

    def rename(self, source: str, target: str) -> None:
        what = f"renaming {self.display(source)} to {self.display(target)} failed"
        try:
            renamed = self._fs.rename(self._path(source), self._path(target))
        except Py4JJavaError as err:
            raise OSError(f"{what} ({java_message(err)})") from err
        if not renamed:
            raise OSError(what)

    def move_into_place(self, staged: str, target: str, *, overwrite: bool) -> None:
        """Rename `staged` to `target`; an existing target is replaced only with `overwrite`."""
        if self.exists(target):
            if not overwrite:
                raise FileExistsError(f"{self.display(target)} already exists; pass --overwrite or choose another "
                                      "output_dir.")
            old = f"{_parent(target)}.{_base(target)}.old-{uuid.uuid4().hex[:8]}"
            self.rename(target, old)  # Hadoop's rename moves into an existing folder: clear the name first
            try:
                self.rename(staged, target)
            except BaseException:
                self.rename(old, target)  # the previous results stay where they were
                raise
            self.delete(old)
        else:
            if _parent(target):
                self.mkdirs(_parent(target))
            self.rename(staged, target)

    def parent(self) -> tuple[RunFiles, str]:
        """The folder holding this directory, and this directory's name in it."""
        up = self._root.getParent()
        if up is None:
            raise ValueError(f"output_dir={self.display()!r} is a filesystem's root; name a folder inside it.")
        other = RunFiles.__new__(RunFiles)
        other._jvm = self._jvm
        other._bind(self._fs, up)
        return other, str(self._root.getName())

    def nearest_existing(self) -> tuple[str, bool]:
        """The closest existing folder at or above this directory, and whether it is a file instead."""
        path = self._root
        while path is not None and not self._fs.exists(path):
            path = path.getParent()
        if path is None:
            return self.root, False
        return str(path), bool(self._fs.getFileStatus(path).isFile())

    def can_create_in(self, folder: str) -> str | None:
        """None if a folder can be made in `folder`; else why not."""
        probe = self._jvm.org.apache.hadoop.fs.Path(folder, f".blocksync-probe-{uuid.uuid4().hex[:8]}")
        try:
            if not self._fs.mkdirs(probe):
                return "mkdirs refused"
            self._fs.delete(probe, True)
        except Py4JJavaError as err:
            return java_message(err)
        return None


def _parent(name: str) -> str:
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1]
