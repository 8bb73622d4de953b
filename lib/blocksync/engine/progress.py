"""The driver's view of a running barrier stage: progress, heartbeats, and the stall watchdog.

The driver listens on its own Spark address (ephemeral port) for the length of
the stage. Every rank connects once and, from a background thread, sends its
current step and phase (load, startup, compute, sync, checkpoint) every
0.5 s; rank 0 also sends progress (epoch, loss, samples/s), shown as a tqdm bar
or, in quiet mode, one log line per epoch.

The stall watchdog, and how the root cause of a failure is chosen: `RunMonitor`.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from blocksync.engine.last_words import fatal_line

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 0.5
SILENT_SECONDS = 3.0
"""A rank's heartbeats missing this long (6 beats) while others' arrive: it is cut off."""
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|Horovod has been shut down")
"""What a rank's error says when only a peer of it failed (see the module docstring)."""


class RunMonitor:
    """The watchdog: every rank must be past loading and collective start-up within
    `startup_seconds` (timeouts.barrier_seconds), else the stage is cancelled naming
    the ranks still there. After that, when no rank has moved to another step or phase for
    `stall_seconds` (and at least SILENT_SECONDS), a rank whose heartbeats stopped
    while the others' arrive is cut off (its host or network is down), whatever its last
    beat said; else the ranks not waiting inside a collective are the stalled
    ones (the others wait for them); the monitor records which, and at what step,
    and calls `on_stall` (the launcher cancels the stage). A rank whose connection
    ends without a final "done" died (its Python worker exited); that is recorded
    too, and a rank that raised sends its error first. The first of these events
    is the root cause the launcher reports, except that an error which only says a
    peer went away (Gloo's "Connection closed by peer", Horovod's "has been shut
    down") is a consequence: it is reported only when no rank's own failure or death
    shows up within a moment of it (`failure_text`), since a dead rank's peers often
    notice before the monitor sees its connection end. Heartbeats are advisory: a
    rank that cannot connect logs a warning and trains on.
    """
    def __init__(
        self, host: str, total_steps: int, *, show_bar: bool, log_epochs: bool = True,
        stall_seconds: float | None = None, num_ranks: int | None = None, startup_seconds: float | None = None,
        on_stall: Callable[[], None] | None = None, description: str = "training",
    ) -> None:
        self.total_steps = total_steps
        self.num_ranks = num_ranks
        self.startup_seconds = startup_seconds
        self._created = time.monotonic()
        self.log_epochs = log_epochs
        self.stall_seconds = stall_seconds
        self.on_stall = on_stall
        self.ranks: dict[int, dict[str, Any]] = {}
        self.failure: str | None = None
        self.consequence: str | None = None
        """The first error that only says a peer went away (PEER_LOST): the failure when nothing else shows."""
        self.failure_kind = "runtime"
        """`input` when the first failure was a rank's bad data or settings (see worker), else `runtime`."""
        self.last_progress: dict[str, Any] = {}
        self.ended_rank: int | None = None
        """The rank whose process ended without finishing, when that was the first failure."""
        self.last_words: dict[int, list[str]] = {}
        """Per rank, the last stderr lines its relay sent when the rank's process ended."""
        self._lock = threading.Lock()
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.25)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._bar: Any = None
        if show_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, desc=description, unit="step", file=sys.stderr, dynamic_ncols=True)
        self._threads = [threading.Thread(target=self._accept, name="blocksync-monitor", daemon=True),
                         threading.Thread(target=self._watch, name="blocksync-watchdog", daemon=True)]
        for t in self._threads:
            t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        rank = None
        host = str(conn.getpeername()[0])
        with conn, conn.makefile("r", errors="replace") as lines:
            for line in lines:
                try:
                    msg = json.loads(line)
                    if "last_words" in msg:  # a rank's stderr relay (see last_words), not its heartbeat
                        self.last_words[int(msg["rank"])] = [str(w) for w in msg["last_words"]]
                        continue
                    rank = int(msg["rank"])
                    msg["step"], msg["phase"] = int(msg["step"]), str(msg["phase"])
                    self._heartbeat(rank, msg, host)
                except (ValueError, KeyError, TypeError) as err:
                    # One bad line must not end this rank's reader: the next one may be fine.
                    log.warning("run monitor: ignoring a malformed heartbeat (%s): %.200r", err, line)
        if rank is not None:
            with self._lock:
                state = self.ranks[rank]
                if not (state["done"] or state.get("failed")) and self.failure is None and not self._stop.is_set():
                    self.failure = (f"rank {rank}'s Python worker ended without finishing; its last heartbeat "
                                    f"was at step {state['step']} ({state['phase']})")
                    self.ended_rank = rank

    def failure_text(self, wait_seconds: float = 2.0) -> str | None:
        """The first failure. A rank whose process died is described by what it printed as it died
        (its stderr relay reports a moment after the heartbeat connection drops, hence the wait)."""
        deadline = time.monotonic() + wait_seconds
        while self.failure is None and self.consequence is not None and time.monotonic() < deadline:
            time.sleep(0.05)  # a peer's connection error came first: the rank that caused it may yet show
        rank = self.ended_rank
        if rank is None or self.failure is None:
            return self.failure or self.consequence
        deadline = time.monotonic() + wait_seconds
        while rank not in self.last_words and time.monotonic() < deadline:
            time.sleep(0.05)
        words = self.last_words.get(rank, [])
        fatal = fatal_line(words)
        if fatal:
            state = self.ranks[rank]
            return (f"rank {rank}'s Python worker died: {fatal[:1500]} (its last heartbeat was at step "
                    f"{state['step']}, {state['phase']})")
        if words:
            return f"{self.failure}; the last line on its stderr: {words[-1][:500]}"
        return self.failure

    def _heartbeat(self, rank: int, msg: dict[str, Any], host: str = "") -> None:
        now = time.monotonic()
        with self._lock:
            state = self.ranks.setdefault(rank, {"step": -1, "phase": "", "changed": now, "done": False})
            state.update(seen=now, host=host)
            if (msg["step"], msg["phase"]) != (state["step"], state["phase"]):
                state.update(step=msg["step"], phase=msg["phase"], changed=now)
            state["done"] = state["done"] or bool(msg.get("done"))
            if msg.get("failed"):
                state["failed"] = True
                text = f"[blocksync rank {rank}] {msg['failed']} (at step {msg['step']}, {msg['phase']})"
                if PEER_LOST.search(str(msg["failed"])):
                    self.consequence = self.consequence or text
                elif self.failure is None:
                    self.failure = text
                    self.failure_kind = "input" if msg.get("kind") == "input" else "runtime"
        if "progress" in msg:
            self._show(msg["progress"])

    def _show(self, progress: dict[str, Any]) -> None:
        self.last_progress = progress
        if self._bar is not None:
            self._bar.n = progress["step"]
            self._bar.set_postfix(
                epoch=progress["epoch"], loss=f"{progress['loss']:.4f}", samples_s=f"{progress['samples_per_sec']:.0f}"
            )
        elif progress.get("epoch_end") and self.log_epochs:
            log.info("epoch %d step %d/%d loss %.4f samples/s %.0f", progress["epoch"], progress["step"],
                     self.total_steps, progress["loss"], progress["samples_per_sec"])

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            if self.failure is not None:
                continue
            with self._lock:
                self.failure = self._startup_overdue() or self._stalled()
            if self.failure is None:
                continue
            log.error("%s; cancelling the stage", self.failure)
            if self.on_stall is not None:
                self.on_stall()

    def _startup_overdue(self) -> str | None:
        """Every rank must be past loading and collective start-up within `startup_seconds`
        (timeouts.barrier_seconds): the engine's own bound, whatever spark.barrier.sync.timeout is."""
        waited = time.monotonic() - self._created
        if self.startup_seconds is None or self.num_ranks is None or waited <= self.startup_seconds:
            return None
        late = [f"rank {r} never reported" for r in range(self.num_ranks) if r not in self.ranks]
        late += [f"rank {r} still in {s['phase']}" for r, s in sorted(self.ranks.items())
                 if s["phase"] in ("load", "startup") and not s["done"]]
        if not late:
            return None
        return (f"start-up took over {self.startup_seconds:g} s (timeouts.barrier_seconds): {', '.join(late)}; "
                "raise timeouts.barrier_seconds for large blocks, or check that executor's log")

    def _stalled(self) -> str | None:
        """No rank moved to another step or phase for `stall_seconds`: name the ranks holding the others up."""
        active = {r: s for r, s in self.ranks.items() if not s["done"]}
        # Loading and collective start-up are bounded by _startup_overdue. Start-up is collective, so once
        # one rank is past it all are: a rank still shown in it then is one whose beats stopped arriving.
        if self.stall_seconds is None or all(s["phase"] in ("load", "startup") for s in active.values()):
            return None
        now = time.monotonic()
        idle = now - max(s["changed"] for s in active.values())
        if idle <= self.stall_seconds:
            return None
        # A rank whose heartbeats stopped arriving while the others' still do is cut off: its host or
        # its network is down, and the others wait for it inside the collective.
        silent = [r for r, s in active.items() if now - s["seen"] > SILENT_SECONDS]
        if silent and len(silent) < len(active):
            where = ", ".join(f"rank {r}{self._on(r)} at step {active[r]['step']} ({active[r]['phase']}), silent "
                              f"for {now - active[r]['seen']:.1f} s" for r in sorted(silent))
            return (f"stalled: {where}: its heartbeats stopped while the other ranks' arrive, so its host or "
                    f"network is down; no rank made progress for {idle:.1f} s "
                    f"(timeouts.step_seconds={self.stall_seconds:g})")
        if idle <= SILENT_SECONDS:
            return None  # give a cut-off rank time to show by its silence, whatever its last beat said
        stalled = [r for r, s in active.items() if s["phase"] != "sync"]
        if not stalled:
            low = min(s["step"] for s in active.values())
            stalled = [r for r, s in active.items() if s["step"] == low]
        where = ", ".join(f"rank {r} at step {active[r]['step']} ({active[r]['phase']})" for r in sorted(stalled))
        return (f"stalled: {where}; no rank made progress for {idle:.1f} s "
                f"(timeouts.step_seconds={self.stall_seconds:g})")

    def _on(self, rank: int) -> str:
        host = self.ranks[rank].get("host")
        return f" on {host}" if host else ""

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        for t in self._threads:
            t.join(timeout=5)
        if self._bar is not None:
            self._bar.close()


class Heartbeat:
    """A rank's side: its step and phase every 0.5 s from a thread; rank 0's progress, throttled."""

    def __init__(self, address: str | None, rank: int) -> None:
        self.rank = rank
        self.step = 0
        self.phase = "load"
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_progress = 0.0
        self._failed = False
        if not address:
            return
        host, port = address.rsplit(":", 1)
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=5)
        except OSError as err:
            log.warning("rank %d: cannot reach the driver's monitor at %s (%s); training goes on without it",
                        rank, address, err)
            return
        threading.Thread(target=self._beat, name="blocksync-heartbeat", daemon=True).start()

    def _send(self, msg: dict[str, Any]) -> None:
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall((json.dumps({"rank": self.rank, "step": self.step, "phase": self.phase, **msg})
                                    + "\n").encode())
            except OSError as err:
                log.warning("rank %d: monitor connection lost (%s)", self.rank, err)
                self._sock.close()
                self._sock = None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self._send({})

    def at(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase

    def progress(self, *, epoch: int, step: int, loss: float, samples_per_sec: float, epoch_end: bool = False) -> None:
        now = time.monotonic()
        if not epoch_end and now - self._last_progress < HEARTBEAT_SECONDS:
            return
        self._last_progress = now
        self._send({"progress": {"epoch": epoch, "step": step, "loss": loss, "samples_per_sec": samples_per_sec,
                                 "epoch_end": epoch_end}})

    def flush(self) -> None:
        """Send the current step and phase now (before something that may end the process)."""
        self._send({})

    def fail(self, error: str, kind: str = "runtime") -> None:
        """Report this rank's error now, once: before its collective closes and its peers fail in turn."""
        if not self._failed:
            self._failed = True
            self._send({"failed": error[:2000], "kind": kind})

    def close(self, *, done: bool, error: str | None = None, kind: str = "runtime") -> None:
        self._stop.set()
        if done:
            self._send({"done": True})
        elif error:
            self.fail(error, kind)
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
