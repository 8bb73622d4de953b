"""This worker's anonymous memory (RssAnon): now, and its peak while training, sampled by a thread.

RSS counts mapped files (libraries, an mmapped block); RssAnon is the heap, the
tensors and the optimizer state, which is what sharding saves. Linux keeps no
peak of it, so a daemon thread reads it every `interval` seconds.
"""

from __future__ import annotations

import threading


def status_mb(field: str) -> float | None:
    """A kB field of /proc/self/status (RssAnon, VmHWM, ...) in MiB; None where there is no /proc."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_anon_mb() -> float | None:
    """RssAnon of this process in MiB, as /proc counts it."""
    return status_mb("RssAnon")


class AnonPeak:
    """The highest RssAnon seen between start and `stop()` (sampled: a spike shorter than `interval` can
    slip between two samples)."""

    def __init__(self, interval: float = 0.02) -> None:
        self.peak = rss_anon_mb() or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="anon-peak", daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def sample(self) -> float:
        self.peak = max(self.peak, rss_anon_mb() or 0.0)
        return self.peak

    def stop(self) -> float:
        """Stop sampling; returns the peak in MiB (0 without /proc)."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        return self.sample()
