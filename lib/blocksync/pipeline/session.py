"""SparkSession construction for local runs, tests and the CLI.

Local sessions bind everything to 127.0.0.1 (this project's tests must not use
another interface) and make the executors run this interpreter, so the
venv's torch and Horovod are the ones the workers import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    # A barrier stage that cannot get its slots fails after this many checks instead of 40.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
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
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**LOCAL_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, str(value))
    return builder.getOrCreate()
