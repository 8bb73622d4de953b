"""A run directory reached through Spark's own filesystem layer: Hadoop's FileSystem, on the driver's JVM.

Spark writes a run's Parquet (prepared data, predictions) with its DataFrame writers. The driver writes its own
files (model, metrics, history, report) through this class, that is through the same Hadoop FileSystem, with
the same configuration and credentials. So `output_dir` may be anything Spark writes to: a local path,
`file:/`, `hdfs://`, `s3a://`, `dbfs:/`, `sftp://` (tested: an SSH server on loopback). A path without a
scheme means what it means to Spark's writers: the driver's working directory when the default filesystem is
the local disk (local mode, standalone clusters without HDFS), otherwise a path on `fs.defaultFS` (HDFS on
YARN clusters, DBFS on Databricks); `file:/shared/runs` names a mount there.

The driver makes its files in a local temporary folder and copies them up (`upload`); each stage then renames
what it made into place (`move_into_place`), so a failed stage leaves no half-written entry behind. Within one
local filesystem and on HDFS a rename is atomic; on object stores it is a copy, as it is for Spark's own
commits. A filesystem's Java error reaches the caller as an OSError naming the operation and the path.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql import SparkSession

from blocksync.pipeline.sources import is_uri

log = logging.getLogger(__name__)


def java_message(err: Py4JJavaError) -> str:
    """The Java exception's class and first message line, not its stack trace."""
    cause = err.java_exception
    message = str(cause.getMessage() or "").splitlines()
    return f"{cause.getClass().getSimpleName()}: {message[0] if message else ''}".strip()


def _java(failed: str, call: Callable[[], Any]) -> Any:
    """`call()`, with a filesystem's Java error raised as an OSError: `failed` and the Java message."""
    try:
        return call()
    except Py4JJavaError as err:
        raise OSError(f"{failed} ({java_message(err)})") from err


class RunFiles:
    """Files under one directory (`root`), named by paths relative to it ("" is the directory itself)."""

    def __init__(self, spark: SparkSession, root: str | os.PathLike[str], *, setting: str = "output_dir") -> None:
        """`setting` names the path in errors: output_dir, or predict's --model."""
        self.setting = setting
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
        try:
            path = jvm.org.apache.hadoop.fs.Path(text)
            fs = path.getFileSystem(conf)
        except Py4JJavaError as err:
            raise ValueError(f"{setting}={text!r}: no filesystem for it ({java_message(err)}); check the scheme "
                             "and Spark's filesystem settings (spark.hadoop.fs.<scheme>.impl).") from err
        checksums = jvm.java.lang.Class.forName("org.apache.hadoop.fs.ChecksumFileSystem")
        if checksums.isInstance(fs):
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

    def _local_path(self, local: Path) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._jvm.java.io.File(str(local.resolve())).toURI())

    def _call(self, what: str, name: str, call: Callable[[], Any]) -> Any:
        return _java(f"{what} {self.display(name)} failed", call)

    def uri(self, name: str = "") -> str:
        """Where `name` is, for Spark's readers and writers."""
        return str(self._path(name))

    def display(self, name: str = "") -> str:
        """Where `name` is, for people: a plain path on the local disk, else the URI."""
        if self.local is not None:
            return str(self.local / name) if name else str(self.local)
        return self.uri(name)

    def exists(self, name: str = "") -> bool:
        return bool(self._call("checking", name, lambda: self._fs.exists(self._path(name))))

    def is_file(self, name: str = "") -> bool:
        return self.exists(name) and bool(
            self._call("checking", name, lambda: self._fs.getFileStatus(self._path(name)).isFile()))

    def read_bytes(self, name: str) -> bytes:
        if self.local is not None:
            return (self.local / name).read_bytes()

        def read() -> bytes:
            stream = self._fs.open(self._path(name))
            try:
                return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()

        return bytes(self._call("reading", name, read))

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def write_text(self, name: str, text: str) -> None:
        def write() -> None:
            stream = self._fs.create(self._path(name), True)
            try:
                stream.write(bytearray(text.encode("utf-8")))
            finally:
                stream.close()

        self._call("writing", name, write)

    def upload(self, local: Path, name: str, *, overwrite: bool = False) -> None:
        """Copy a local file or folder to `name` (which must not exist, unless `overwrite` and a file)."""
        self._call("copying to", name,
                   lambda: self._fs.copyFromLocalFile(False, overwrite, self._local_path(local), self._path(name)))

    def download(self, name: str, local: Path) -> Path:
        """Copy `name` (a file or folder) to the local path `local`, which must not exist yet; return it."""
        if local.exists():
            raise FileExistsError(f"{local} exists: download copies to a new path")
        self._call("copying from", name,
                   lambda: self._fs.copyToLocalFile(False, self._path(name), self._local_path(local), True))
        return local

    def mkdirs(self, name: str = "") -> None:
        if not self._call("making", name, lambda: self._fs.mkdirs(self._path(name))):
            raise OSError(f"making {self.display(name)} failed")

    def delete(self, name: str) -> None:
        self._call("removing", name, lambda: self._fs.delete(self._path(name), True))

    def discard(self, name: str) -> None:
        """Delete `name` if it is there; a failure is logged, not raised: clean-up must not hide the error
        that led to it, nor fail a stage that has finished."""
        try:
            self.delete(name)
        except (OSError, Py4JError) as err:
            if self.local is not None and _remove_local(self.local / name):  # the JVM is gone (a SIGTERM'd group)
                return
            log.warning("could not remove %s: %s", self.display(name), err)

    def rename(self, source: str, target: str) -> None:
        what = f"renaming {self.display(source)} to {self.display(target)} failed"
        if not _java(what, lambda: self._fs.rename(self._path(source), self._path(target))):
            raise OSError(what)

    def move_into_place(self, staged: str, target: str, *, overwrite: bool) -> None:
        """Rename `staged` to `target`; an existing target is replaced only with `overwrite`."""
        if not self.exists(target):
            if _parent(target):
                self.mkdirs(_parent(target))
            self.rename(staged, target)
            return
        if not overwrite:
            raise FileExistsError(f"{self.display(target)} already exists; pass --overwrite or choose another "
                                  "output_dir.")
        old = f"{_parent(target)}.{_base(target)}.old-{uuid.uuid4().hex[:8]}"
        self.rename(target, old)  # Hadoop's rename moves into an existing folder: clear the name first
        try:
            self.rename(staged, target)
        except BaseException:
            self._restore(old, target)
            raise
        self.discard(old)

    def _restore(self, old: str, target: str) -> None:
        """Put the previous results back after a failed replacement (a copying rename may have left a part)."""
        try:
            if self.exists(target):
                self.delete(target)
            self.rename(old, target)
        except OSError as err:
            log.warning("the previous %s stays at %s: %s", self.display(target), self.display(old), err)

    def parent(self) -> tuple[RunFiles, str]:
        """The folder holding this directory, and this directory's name in it."""
        up = self._root.getParent()
        if up is None:
            raise ValueError(f"output_dir={self.display()!r} is a filesystem's root; name a folder inside it.")
        other = RunFiles.__new__(RunFiles)
        other._jvm = self._jvm
        other.setting = self.setting
        other._bind(self._fs, up)
        return other, str(self._root.getName())

    def child(self, name: str) -> RunFiles:
        """The directory `name` inside this one, on the same filesystem."""
        other = RunFiles.__new__(RunFiles)
        other._jvm = self._jvm
        other.setting = self.setting
        other._bind(self._fs, self._fs.makeQualified(self._path(name)))
        return other

    def holds_files(self) -> bool:
        """Whether a file lies anywhere under this directory."""
        return bool(self._call("listing", "", lambda: self._fs.listFiles(self._root, True).hasNext()))

    def entries(self, name: str = "") -> list[tuple[str, float]]:
        """The names in the folder `name`, each with its modification time (seconds since the epoch)."""
        statuses = self._call("listing", name, lambda: self._fs.listStatus(self._path(name)))
        return [(str(s.getPath().getName()), s.getModificationTime() / 1000.0) for s in statuses]

    def nearest_existing_above(self) -> tuple[str, bool, str]:
        """The closest existing folder above this directory (where `run` stages it): as shown to people,
        whether it is a file instead, and its URI."""
        path = self._root.getParent()
        while path is not None and not self._exists_at(path):
            path = path.getParent()
        if path is None:
            return self.display(), False, self.root
        shown = path.toUri().getPath() if self.local is not None else str(path)
        return str(shown), bool(self._fs.getFileStatus(path).isFile()), str(path)

    def _exists_at(self, path: Any) -> bool:
        return bool(_java(f"checking {path} failed", lambda: self._fs.exists(path)))

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


def _remove_local(path: Path) -> bool:
    """Remove a local file or folder without the JVM; whether it is gone."""
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return not path.exists()


def _parent(name: str) -> str:
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1]
