"""Where the time before the first step goes, per rank, measured with wall clocks.

The driver stamps each attempt's plan with `launched_at` (time.time() as it
submits the barrier job); each rank stamps the rest (`StartupClock` lists the phases).
"""

from __future__ import annotations

import os
import time

PHASES = ("spawn_s", "imports_s", "load_s", "rendezvous_s", "init_s", "first_step_s")


def process_started_at() -> float:
    """This process's start in time.time() seconds, to the kernel's 10 ms tick (Linux /proc);
    now where /proc is missing. Its age comes from boot-relative clocks, as /proc/stat's boot
    time is whole seconds."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the comm field
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class StartupClock:
    """The stamps of one rank's start-up; `phases()` turns them into seconds.

    - `spawn_s`: submission to the start of this Python worker process (Spark's
      scheduling, any stages the blocks still depend on, the fork of the worker);
      0 when Spark reused a worker that already existed.
    - `imports_s`: from then to the task function's first line (unpickling the
      closure imports blocksync and torch; near 0 in a reused worker).
    - `load_s`: receiving and storing the block.
    - `rendezvous_s`: agreeing on the blocks and starting the collective backend.
    - `init_s`: building the model, broadcasting rank 0's parameters, the optimizer.
    - `first_step_s`: the first training step of this attempt.
    - `launch_to_first_step_s`: submission to the end of the first step.

    Across hosts the phases that compare a driver stamp with a worker stamp
    (`spawn_s`, `launch_to_first_step_s`) assume synchronized clocks (NTP).
    """

    def __init__(self, launched_at: float, entered_at: float) -> None:
        self.launched_at = launched_at or entered_at
        self.process_at = min(process_started_at(), entered_at)
        self.stamps = {"entered": entered_at}

    def mark(self, name: str) -> None:
        self.stamps[name] = time.time()

    def phases(self) -> dict[str, float]:
        s = self.stamps
        since = max(self.process_at, self.launched_at)  # a reused worker started before the launch
        out = {
            "spawn_s": max(0.0, self.process_at - self.launched_at),
            "imports_s": max(0.0, s["entered"] - since),
            "load_s": s["loaded"] - s["entered"],
            "rendezvous_s": s["connected"] - s["loaded"],
            "init_s": s["initialized"] - s["connected"],
            "first_step_s": s.get("first_step", s["initialized"]) - s["initialized"],
        }
        out["launch_to_first_step_s"] = s.get("first_step", s["initialized"]) - self.launched_at
        return {k: round(v, 4) for k, v in out.items()}


def describe(phases: dict[str, float]) -> str:
    """One line: the slowest rank's time from launch to its first step, and where it went ("" if unknown)."""
    if not phases:
        return ""
    parts = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {phases[k]:.2f} s" for k in PHASES)
    if "probe_s" in phases:  # balance=speed's probe stage, which ran before the launch
        parts += (f"; before the launch: speed probe {phases['probe_s']:.2f} s ({phases.get('probe_start_s', 0):.2f} s "
                  "of it until its last task started: the Python workers' start, which reused workers skip in "
                  "training)")
    return f"launch to first step {phases['launch_to_first_step_s']:.2f} s (rank {phases['rank']:.0f}): {parts}"
