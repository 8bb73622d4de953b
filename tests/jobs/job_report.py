"""What every test job does around its body: open the session, write the body's JSON report, stop the session."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession


def run_and_report(open_session: Callable[[], SparkSession], body: Callable[[SparkSession], dict[str, Any]]) -> None:
    """Run `body` on a new session and write its report to the path given as the script's first argument."""
    out_path = sys.argv[1]
    spark = open_session()
    try:
        report = body(spark)
        with open(out_path, "w") as fh:
            json.dump(report, fh)
    finally:
        spark.stop()
