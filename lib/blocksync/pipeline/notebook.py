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


def show_report(run_dir: str, display_html: Any = None) -> str:
    """Show report.png inline where a notebook can (Databricks' displayHTML), and return its path."""
    import base64
    from pathlib import Path

    path = Path(run_dir) / "report.png"
    if display_html is not None:
        encoded = base64.b64encode(path.read_bytes()).decode("ascii")
        display_html(f'<img src="data:image/png;base64,{encoded}" style="max-width:100%"/>')
    return str(path)
