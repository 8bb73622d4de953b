"""What kind of Spark session the driver holds: Spark Connect or classic, local or a cluster."""

from __future__ import annotations

from pyspark.sql import SparkSession


def is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_local(spark: SparkSession) -> bool:
    """A local master: the tasks run inside the driver JVM (its one executor is the driver)."""
    return not is_connect(spark) and (spark.sparkContext.master or "").startswith("local")
