"""Record the JVM class archive that local sessions start with (`session.JVM_ARCHIVE`).

`python -m blocksync.pipeline.jvm_archive [--config conf/local.yaml]` (`make setup` runs it) runs that
config's pipeline once, into a temporary folder, in a JVM started with `-XX:ArchiveClassesAtExit`: as
it exits, the JVM writes every class it loaded into a class-data-sharing archive (JDK 13 and later).
Later local sessions map those classes instead of loading them one by one (`class_archive_option`).

The archive belongs to this JDK build and these Spark jars; a JVM that finds either changed ignores
it, with a warning in its log, and `make setup` records it again when the pins change. Its size goes
into a file beside it (`session.archive_size_file`): a truncated archive crashes the JVM, so local
sessions use it only at that size.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from blocksync.pipeline.run_config import load_config
from blocksync.pipeline.session import JVM_ARCHIVE, archive_size_file, jvm_output_to, local_session

JVM_EXIT_SECONDS = 300


def record(config_path: str = "conf/local.yaml", target: Path = JVM_ARCHIVE) -> Path:
    """Run the pipeline of `config_path` in a fresh JVM that writes its classes to `target` as it exits."""
    from blocksync.pipeline.stages import run

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")  # a JVM starting meanwhile never maps half a file
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="blocksync-archive-") as tmp:
        config = load_config(config_path, [f"output_dir={tmp}/run", "progress=false"])
        conf = {**config.spark.conf, "spark.driver.defaultJavaOptions": f"-XX:ArchiveClassesAtExit={partial}"}
        with jvm_output_to(Path(tmp) / "jvm.log"):
            spark = local_session(config.spark.master or "local[4]", "blocksync-jvm-archive", conf)
        try:
            run(spark, config)
        finally:
            spark.stop()
            end_jvm()
    if not partial.is_file():
        raise RuntimeError(f"the JVM exited without writing {partial}; is this JDK 13 or later?")
    archive_size_file(target).unlink(missing_ok=True)  # no moment where a new archive passes an old size
    partial.replace(target)
    archive_size_file(target).write_text(str(target.stat().st_size))
    return target


def end_jvm() -> None:
    """Close the JVM PySpark started and wait for it: it exits when its stdin closes, and it writes
    the archive as it exits (PySpark keeps the process on its gateway, `SparkContext._gateway.proc`)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = gateway.proc
    gateway.shutdown()
    proc.stdin.close()
    proc.wait(timeout=JVM_EXIT_SECONDS)
    SparkContext._gateway = None
    SparkContext._jvm = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blocksync.pipeline.jvm_archive", description=__doc__)
    parser.add_argument("--config", default="conf/local.yaml", help="the run whose classes to record")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    path = record(args.config)
    print(f"recorded {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
