"""A rank's last words: what its process wrote to stderr before it died, sent to the driver.

A native library that aborts the process (Gloo's `terminate called after
throwing an instance of 'gloo::IoException'`, a CUDA assert, a segfault) kills
the Python worker before any Python handler runs, and its message lands in the
executor's stderr, on another host. So while a rank trains, its stderr (file
descriptor 2) goes through a pipe to a small relay process. The relay copies
every line to the real stderr (the executor log is unchanged) and keeps the last 20
lines; when the pipe closes (the worker finished, or died), it sends them to the
driver's run monitor, which uses them only for a rank that ended without finishing.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

# Runs as `python -S -c RELAY rank host port`: stdlib only, starts in milliseconds.
RELAY = r"""
import collections, json, socket, sys
rank, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tail = collections.deque(maxlen=20)
for raw in sys.stdin.buffer:
    sys.stdout.buffer.write(raw)
    sys.stdout.buffer.flush()
    line = raw.decode(errors="replace").rstrip()
    if line.strip():
        tail.append(line)
try:
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall((json.dumps({"rank": rank, "last_words": list(tail)}) + "\n").encode())
except OSError:
    pass
"""

# What native code prints as it kills the process, most telling first.
_FATAL = (re.compile(r"what\(\):\s*(.*)"), re.compile(r"(Fatal Python error: .*)"),
          re.compile(r"(terminate called .*)"))


def fatal_line(words: list[str]) -> str | None:
    """The line that says why the process died (a C++ exception's what(), a fatal error), if any."""
    for pattern in _FATAL:
        for line in reversed(words):
            found = pattern.search(line)
            if found and found.group(1).strip():
                return found.group(1).strip()
    return None


class StderrRelay:
    """While open, this process's stderr passes through the relay (see the module docstring)."""

    def __init__(self, monitor_address: str | None, rank: int) -> None:
        self._saved: int | None = None
        self._proc: subprocess.Popen | None = None
        if not monitor_address:
            return
        host, port = monitor_address.rsplit(":", 1)
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen([sys.executable, "-S", "-c", RELAY, str(rank), host, port],
                                          stdin=read, stdout=2, close_fds=True)
        except OSError:
            os.close(write)
            return
        finally:
            os.close(read)
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(write, 2)
        os.close(write)

    def close(self) -> None:
        """Give stderr back; the relay sees the pipe close, reports, and exits."""
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None
        if self._proc is not None:
            # A child of this worker may still hold the pipe; the relay then ends with it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
