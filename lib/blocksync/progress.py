"""Live progress from rank 0 to the driver while the barrier stage runs.

The driver listens on its own Spark address (ephemeral port) for the length of
the stage; rank 0 connects once and sends a JSON line at most every 0.5 s and at
every epoch end. The driver shows it as a tqdm bar (epoch, step, loss,
samples/s) or, in quiet mode, logs one line per epoch. Progress is advisory:
if rank 0 cannot connect, it logs a warning and training goes on.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class ProgressServer:
    def __init__(self, host: str, total_steps: int, *, show_bar: bool, description: str = "training") -> None:
        self.total_steps = total_steps
        self.show_bar = show_bar
        self.last: dict[str, Any] = {}
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.5)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._bar: Any = None
        if show_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, desc=description, unit="step", file=sys.stderr, dynamic_ncols=True)
        self._thread = threading.Thread(target=self._serve, name="blocksync-progress", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, conn.makefile("r") as lines:
                for line in lines:
                    self._update(json.loads(line))

    def _update(self, msg: dict[str, Any]) -> None:
        self.last = msg
        if self._bar is not None:
            self._bar.n = msg["step"]
            self._bar.set_postfix(
                epoch=msg["epoch"], loss=f"{msg['loss']:.4f}", samples_s=f"{msg['samples_per_sec']:.0f}"
            )
        elif msg.get("epoch_end"):
            log.info("epoch %d step %d/%d loss %.4f samples/s %.0f", msg["epoch"], msg["step"],
                     self.total_steps, msg["loss"], msg["samples_per_sec"])

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)
        if self._bar is not None:
            self._bar.close()


class ProgressReporter:
    """Rank 0's side: throttled JSON lines to the driver."""

    def __init__(self, address: str | None, interval: float = 0.5) -> None:
        self._sock: socket.socket | None = None
        self._interval = interval
        self._last = 0.0
        if address:
            host, port = address.rsplit(":", 1)
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError as err:
                log.warning("progress: cannot reach the driver at %s (%s); training goes on without it", address, err)

    def update(self, *, epoch: int, step: int, loss: float, samples_per_sec: float, epoch_end: bool = False) -> None:
        now = time.monotonic()
        if self._sock is None or (not epoch_end and now - self._last < self._interval):
            return
        self._last = now
        msg = {"epoch": epoch, "step": step, "loss": loss, "samples_per_sec": samples_per_sec, "epoch_end": epoch_end}
        try:
            self._sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError as err:
            log.warning("progress: connection to the driver lost (%s)", err)
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
