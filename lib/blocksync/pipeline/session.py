"""SparkSession construction for local runs, tests and the CLI.

Local sessions bind everything to 127.0.0.1 (this project's tests must not use
another interface) and make the executors run this interpreter, so the
venv's torch and Horovod are the ones the workers import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    # A barrier stage that cannot get its slots fails after this many checks instead of 40.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Python workers fork from a daemon that has torch imported already (blocksync/daemon.py).
    "spark.python.daemon.module": "blocksync.daemon",
}


def local_session(
    master: str = "local[4]",
    app_name: str = "blocksync",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A loopback-only session; `conf` overrides the defaults."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {**LOCAL_DEFAULTS, **class_archive_option(), **(conf or {})}
    return create_session(SparkSession.builder.master(master).appName(app_name), conf)


JVM_ARCHIVE = Path(sys.prefix) / "share" / "blocksync" / "spark-classes.jsa"
"""The class-data-sharing archive local sessions start their JVM with, when it exists: every class a
demo run loads, recorded by `make setup` (`python -m blocksync.pipeline.jvm_archive`)."""


def archive_size_file(archive: Path) -> Path:
    """Where the recording notes the archive's size in bytes, beside it."""
    return archive.with_name(archive.name + ".bytes")


def class_archive_option() -> dict[str, str]:
    """`spark.driver.defaultJavaOptions` naming JVM_ARCHIVE, when it exists whole.

    The JVM then maps those classes from the archive instead of reading, parsing and verifying each
    class file of Spark's jars: the cold start that a short local run spends most of its JVM time on
    (the demo's wall time with and without it: benchmarks/results/demo.md). Unlike C1-only JIT flags
    it costs nothing once the classes are loaded. A JVM whose build or Spark jars differ from the
    archive's ignores it, with a warning in its log. A truncated archive is another matter: JDK 17
    dies of SIGBUS mapping it, even with -XX:+VerifySharedSpaces, so an archive whose size differs
    from the one its recording noted is left out, with a warning here. A user's own
    spark.driver.defaultJavaOptions replaces this; spark.driver.extraJavaOptions adds to it.
    """
    if not JVM_ARCHIVE.is_file():
        return {}
    size_file = archive_size_file(JVM_ARCHIVE)
    noted = size_file.read_text().strip() if size_file.is_file() else "unknown"
    if noted != str(JVM_ARCHIVE.stat().st_size):
        log.warning("not using the JVM class archive %s: it is %d bytes, its recording noted %s; record it "
                    "again with `make setup` (python -m blocksync.pipeline.jvm_archive)",
                    JVM_ARCHIVE, JVM_ARCHIVE.stat().st_size, noted)
        return {}
    return {"spark.driver.defaultJavaOptions": f"-XX:SharedArchiveFile={JVM_ARCHIVE}"}


def create_session(builder: SparkSession.Builder, conf: Mapping[str, str]) -> SparkSession:
    """`builder` with `conf`, started; a spark.pyspark.python in `conf` names the executors' Python.

    PySpark reads the executors' Python only from PYSPARK_PYTHON when it starts
    the JVM itself (spark-submit is what honours spark.pyspark.python), so the
    setting is applied to the environment while the context starts, and wins,
    as under spark-submit.
    """
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    python = conf.get("spark.pyspark.python")
    if not python:
        return builder.getOrCreate()
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = str(python)
    try:
        return builder.getOrCreate()
    finally:
        if before is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = before


def jvm_log_path() -> Path:
    """Where a CLI run started from Python sends the JVM's own output (this process's id in the name)."""
    return Path(tempfile.gettempdir()) / f"blocksync-spark-{os.getpid()}.log"


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """Start the JVM inside this block to give it `path` as its stdout and stderr for good.

    The JVM inherits file descriptors 1 and 2 when PySpark launches it, so
    pointing them at a file for the launch keeps its start-up banner, Spark's
    log and the executors' Python output out of the terminal, where the CLI
    prints its own one-line errors. This process's descriptors are restored on exit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def _pass_through(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def warm_python_daemon(spark: SparkSession) -> threading.Thread:
    """Run one tiny Python task in the background, so that an executor's Python daemon starts
    (importing torch, with `blocksync.daemon`) while the driver works on other stages.

    It is a DataFrame Arrow task, like the barrier stage's: Spark keeps one daemon per kind of
    Python runner, and an RDD task would start the RDD runners' daemon, not the one the
    training stage forks its workers from (measured: different parent processes).

    Best effort and only a head start: a failure here is logged at debug level,
    and the stage that needs Python workers next meets and reports any real problem.
    """
    def start() -> None:
        try:
            spark.range(1, numPartitions=1).mapInArrow(_pass_through, "id long").collect()
        except Exception as err:  # noqa: BLE001 (see the docstring)
            log.debug("warming the Python daemon failed: %s", err)

    thread = threading.Thread(target=start, name="blocksync-warm-python", daemon=True)
    thread.start()
    _warming.append(thread)
    return thread


_warming: list[threading.Thread] = []
"""The warm-up tasks started in this process (`stop_session` looks for one still running)."""


def stop_session(spark: SparkSession) -> None:
    """`spark.stop()`, without first waiting for a Python daemon that a warm-up task is still starting.

    In local mode the executors' Python daemon is a child process of the driver's JVM, and while one starts
    (importing torch, seconds) Spark's Python worker factory holds the lock that stopping the session needs:
    a run that failed on a bad input in its first seconds waited that long, about 5 s on 2 cores, to exit.
    So when a warm-up task is still running, the local JVM's Python daemons are sent SIGTERM first, as
    `stop()` would send it once it got the lock; the warm-up task then fails, quietly (its docstring)."""
    if any(t.is_alive() for t in _warming) and (spark.sparkContext.master or "").startswith("local"):
        module = spark.conf.get("spark.python.daemon.module", "pyspark.daemon") or "pyspark.daemon"
        jvm: Any = spark._jvm  # type: ignore[attr-defined]
        jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        for pid in _children_running(jvm_pid, module):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    _warming.clear()
    spark.stop()


def _children_running(parent: int, module: str) -> list[int]:
    """The pids of `parent`'s child processes running `python -m module`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if ppid == parent and b"-m" in argv and module.encode() in argv:
            found.append(int(entry.name))
    return found
