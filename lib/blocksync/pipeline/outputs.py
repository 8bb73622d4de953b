"""Where a command writes: checked before any work, on the filesystem Spark writes with.

`check_output` refuses an output that is a file, lies under a file, cannot be made, or exists (without
overwrite). `refuse_overlap` refuses an output that is, contains or lies inside a path the same command
reads (its input, its model): writing there replaces, and with `--overwrite` first deletes, what is read.
Paths are compared after qualification (scheme, host, absolute path; symbolic links resolved on the local
disk), so `data/x`, `./data/x/` and `file:/abs/data/x` are one path.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

from blocksync.pipeline.run_files import RunFiles
from blocksync.pipeline.sources import is_uri


def check_output(files: RunFiles, *, overwrite: bool) -> None:
    """`files` (an output directory, named by `files.setting` in errors) can be made, or replaced with
    `overwrite`; a file there is never replaced."""
    setting, where = files.setting, files.display()
    if files.is_file():
        raise ValueError(f"{setting}={where!r} is a file, not a directory; choose another {setting}.")
    if files.exists() and not overwrite:  # output_dir is shown as the path alone, --output with its flag
        shown, other = (where, setting) if setting == "output_dir" else (f"{setting} {where}", "path")
        raise FileExistsError(f"{shown} already exists; pass --overwrite or choose another {other}.")
    ancestor, is_file, ancestor_uri = files.nearest_existing_above()
    if is_file:
        raise ValueError(f"{setting}={where!r}: {ancestor} is a file, so the directory cannot be made there; "
                         f"choose another {setting}.")
    # Making a folder is the only reliable test (root passes permission checks; read-only mounts do not).
    why = files.can_create_in(ancestor_uri)
    if why is not None:
        raise ValueError(f"{setting}={where!r} cannot be written ({ancestor}: {why}); choose a writable {setting}.")


def _parts(uri: str) -> tuple[str, str, tuple[str, ...]]:
    split = urlsplit(uri)
    path = os.path.realpath(split.path) if split.scheme in ("", "file") else split.path
    return split.scheme or "file", split.netloc, tuple(p for p in path.split("/") if p)


def refuse_overlap(output: RunFiles, reads: dict[str, str]) -> None:
    """`reads`: setting -> a qualified URI the command reads (`read_root`)."""
    out = _parts(output.root)
    for setting, uri in reads.items():
        other = _parts(uri)
        if out[:2] != other[:2]:
            continue
        if out == other:
            relation = "is"
        elif other[2][: len(out[2])] == out[2]:
            relation = "contains"
        elif out[2][: len(other[2])] == other[2]:
            relation = "lies inside"
        else:
            continue
        raise ValueError(f"{output.setting}={output.display()!r} {relation} {setting} ({uri}): writing there would "
                         f"replace what this command reads; choose an {output.setting} outside {setting}.")


def read_root(spark: SparkSession, source: str, setting: str) -> str | None:
    """The qualified folder or file that `source` (a path, URI or table) is read from; None if not files."""
    if "/" in source or is_uri(source) or not spark.catalog.tableExists(source):
        return RunFiles(spark, source, setting=setting).root
    files = spark.table(source).inputFiles()  # a table: the common folder of its files
    if not files:
        return None
    return os.path.commonpath([urlsplit(f).path for f in files]) if all(
        urlsplit(f).scheme == "file" for f in files) else os.path.dirname(files[0])
