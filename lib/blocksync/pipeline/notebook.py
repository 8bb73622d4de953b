"""Helpers for the notebooks in notebooks/: Databricks widgets when present, plain defaults elsewhere."""

from __future__ import annotations

from typing import Any


def notebook_context(namespace: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(spark, dbutils, displayHTML) from a notebook's globals.

    Databricks predefines all three; elsewhere dbutils and displayHTML are None
    and spark is a new local[4] session.
    """
    spark = namespace.get("spark")
    if spark is None:
        from blocksync.pipeline.session import local_session

        spark = local_session("local[4]", "blocksync-notebook")
    return spark, namespace.get("dbutils"), namespace.get("displayHTML")


def widget(dbutils: Any, name: str, default: str, label: str | None = None) -> str:
    """The value of text widget `name` (created with `default`) on Databricks; `default` without dbutils."""
    if dbutils is None:
        return default
    dbutils.widgets.text(name, default, label or name)
    return str(dbutils.widgets.get(name))


def show_report(run_dir: str, display_html: Any = None, *, spark: Any = None) -> str:
    """Show report.png inline where a notebook can (Databricks' displayHTML), and return where it is.

    The run directory is read as the run wrote it, through the filesystem of `spark` (by default the active
    session): dbfs:/ on Databricks."""
    import base64

    from pyspark.sql import SparkSession

    from blocksync.pipeline.run_files import RunFiles

    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise ValueError("show_report reads the run directory through Spark: start a session or pass spark=.")
    files = RunFiles(session, run_dir)
    if display_html is not None:
        encoded = base64.b64encode(files.read_bytes("report.png")).decode("ascii")
        display_html(f'<img src="data:image/png;base64,{encoded}" style="max-width:100%"/>')
    return files.display("report.png")
