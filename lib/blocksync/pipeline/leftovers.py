"""Staging folders, who made them, and removing those whose maker is provably gone.

Each staging folder a command makes (`run`'s and `predict`'s `.<name>.partial-<id>` beside the output, a
single stage's `.staging-<stage>-<id>` inside the run directory) holds `owner.json`: the host, pid and start
time of the process that made it. A driver killed with SIGKILL, or a host that went down, leaves it behind;
the next command into the same output, and `blocksync clean --output DIR`, remove it once its maker is
provably dead (`why_dead`). A `.<name>.old-<id>` (the previous results while `--overwrite` swaps them in)
is removed once `<name>` is back; without `<name>` it holds the only copy, so it is kept and named.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from blocksync.pipeline.run_files import RunFiles

log = logging.getLogger(__name__)

OWNER = "owner.json"
STALE_HOURS = 72.0
"""A leftover made on another host (whose processes this one cannot see), or without a readable owner.json,
is removed once it is this old."""


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (Linux's /proc/PID/stat field 22); None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the fields after "(command)", which may hold spaces


def owner_record() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "process_start": process_start(pid), "created": time.time()}


def claim(files: RunFiles, folder: str) -> None:
    """Make the staging folder `folder` and sign it with this process's owner record."""
    files.mkdirs(folder)
    files.write_text(f"{folder}/{OWNER}", json.dumps(owner_record()))


def _running(pid: int, started: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    # The same pid with another start time is a new process that reused the number.
    return started is None or process_start(pid) in (None, started)


def why_dead(owner: dict[str, Any] | None, modified: float, now: float, stale_hours: float) -> str | None:
    """Why the maker of a staging folder is provably gone, or None when it may still be running.

    Made on this host: its pid is not running (or is a later process with the same number). Made on another
    host, or no readable owner record: older than `stale_hours` (from its record, else its modification time).
    """
    if owner and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        if _running(owner["pid"], owner.get("process_start")):
            return None
        return f"process {owner['pid']} on this host ({owner['host']}) that made it is gone"
    created = float(owner["created"]) if owner and isinstance(owner.get("created"), int | float) else modified
    age_hours = (now - created) / 3600.0
    if age_hours < stale_hours:
        return None
    maker = f"made on host {owner.get('host')}" if owner else "with no owner record"
    return f"{maker} {age_hours:.0f} hours ago (over {stale_hours:g})"


def _owner(files: RunFiles, folder: str) -> dict[str, Any] | None:
    try:
        record = json.loads(files.read_text(f"{folder}/{OWNER}"))
    except (OSError, ValueError):  # missing (killed before signing), unreadable or damaged: judged by age
        return None
    return record if isinstance(record, dict) else None


def sweep(target: RunFiles, *, stale_hours: float = STALE_HOURS) -> tuple[list[str], list[str]]:
    """Remove the leftovers of stopped commands beside `target` and inside it; returns (removed, kept), each
    a line saying which folder and why."""
    parent, name = target.parent()
    removed: list[str] = []
    kept: list[str] = []
    if parent.exists():
        here = dict(parent.entries())
        for entry, modified in sorted(here.items()):
            if entry.startswith(f".{name}.partial-"):
                _judge(parent, entry, modified, stale_hours, removed, kept)
            elif entry.startswith(f".{name}.old-"):
                if name in here:
                    parent.discard(entry)
                    removed.append(f"{parent.display(entry)}: {target.display()} was replaced after it")
                else:
                    kept.append(f"{parent.display(entry)}: the previous {target.display()}, the only copy; rename "
                                "it back to keep it, or remove it")
    if target.exists() and not target.is_file():
        for entry, modified in sorted(target.entries()):
            if entry.startswith(".staging-"):
                _judge(target, entry, modified, stale_hours, removed, kept)
    for line in removed:
        log.warning("removed a stopped command's leftover %s", line)
    return removed, kept


def _judge(files: RunFiles, folder: str, modified: float, stale_hours: float, removed: list[str],
           kept: list[str]) -> None:
    owner = _owner(files, folder)
    why = why_dead(owner, modified, time.time(), stale_hours)
    if why is None:
        maker = f"process {owner.get('pid')} on {owner.get('host')}" if owner else "its maker"
        kept.append(f"{files.display(folder)}: {maker} may still be running")
        return
    files.discard(folder)
    removed.append(f"{files.display(folder)}: {why}")


class StagedOutput:
    """`.<name>.partial-<id>/` beside `target`, signed (`claim`); its entry `<name>` (`files`, `uri`) is
    written, then renamed onto `target` (`commit`). Leaving the block removes the folder, committed or not,
    and without a commit also the empty folders above it that it made."""

    def __init__(self, target: RunFiles) -> None:
        self.parent, self.name = target.parent()
        self.folder = f".{self.name}.partial-{uuid.uuid4().hex[:8]}"
        self.entry = f"{self.folder}/{self.name}"

    def __enter__(self) -> StagedOutput:
        self.made: RunFiles | None = None  # the highest folder that making the staging folder creates
        above = self.parent
        while not above.exists():
            self.made = above
            above = above.parent()[0]
        claim(self.parent, self.folder)
        self.committed = False
        return self

    @property
    def files(self) -> RunFiles:
        return self.parent.child(self.entry)

    def uri(self) -> str:
        return self.parent.uri(self.entry)

    def commit(self, *, overwrite: bool) -> None:
        self.parent.move_into_place(self.entry, self.name, overwrite=overwrite)
        self.committed = True

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.parent.discard(self.folder)
        if not self.committed and self.made is not None and not self.made.holds_files():
            self.made.discard("")  # the folders made for it, unless something else was written there meanwhile
