"""Is a DataFrame just Parquet files? Then `train` can skip Spark's shuffles (blocks=auto).

`make_blocks` cuts balanced, content-hashed blocks from any DataFrame with
two shuffles of the whole data set. When the DataFrame is nothing but a scan of
Parquet files, optionally narrowed to some of their columns (what
`spark.read.parquet(path)` and `.select("features", "label")` give), the same
rows can be read straight from the files by the workers, as `train_files`
does, with no shuffle at all.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame


def parquet_scan_files(df: DataFrame, columns: list[str]) -> list[str] | None:
    """The Parquet files `df` reads, when it is a plain scan of them holding `columns`; else None.

    `parquet_scan_files` answers from the optimized logical plan: a chain of
    Projects that only pick columns, over a relation whose format is Parquet,
    with no filter, join, sample or computed column anywhere, and with the
    training columns stored in the files themselves (not partition directories),
    and files that pyarrow opens from the driver under the same URI (`file:`,
    `s3:`, `gs:`, `hdfs:` with libhdfs; not Hadoop's own `s3a:`). Anything else,
    including a Spark Connect DataFrame, whose plan the client cannot inspect,
    gets None: it is cut by Spark.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # Spark Connect
        return None
    plan = jdf.queryExecution().optimizedPlan()
    while plan.getClass().getSimpleName() == "Project":
        if not all(_is_column(plan.projectList().apply(i)) for i in range(plan.projectList().size())):
            return None
        plan = plan.child()
    if plan.getClass().getSimpleName() != "LogicalRelation":
        return None
    relation = plan.relation()
    if relation.getClass().getSimpleName() != "HadoopFsRelation" or relation.fileFormat().toString() != "Parquet":
        return None
    stored = set(relation.dataSchema().fieldNames())
    if not set(columns) <= stored:
        return None
    files = df.inputFiles()
    if not files or not pyarrow_opens(files[0]):
        return None
    return sorted(files)


def pyarrow_opens(uri: str) -> bool:
    """Whether pyarrow has a filesystem for `uri` (a plain path: the local one)."""
    try:
        pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, OSError, ValueError):
        return False
    return True


def _is_column(expression: Any) -> bool:
    return bool(expression.getClass().getSimpleName() == "AttributeReference")
