"""The driver's run monitor, fed by plain sockets (no Spark): bad heartbeats, start-up bound, failure kinds."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from blocksync.engine.driver.launcher import worker_error
from blocksync.engine.progress import RunMonitor

pytestmark = pytest.mark.timeout(60)


def connect(monitor: RunMonitor) -> socket.socket:
    host, port = monitor.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def send(sock: socket.socket, text: str) -> None:
    sock.sendall((text + "\n").encode())


def wait_for(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_malformed_heartbeat_does_not_end_the_reader():
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False)
    try:
        with connect(monitor) as sock:
            send(sock, json.dumps({"rank": 0, "step": 1, "phase": "compute"}))
            for bad in ("{not json", json.dumps({"step": 2}), json.dumps({"rank": "x", "step": 2, "phase": "a"}),
                        json.dumps([1, 2])):
                send(sock, bad)
            send(sock, json.dumps({"rank": 0, "step": 3, "phase": "sync"}))
            wait_for(lambda: monitor.ranks.get(0, {}).get("step") == 3)
            assert monitor.ranks[0]["step"] == 3 and monitor.ranks[0]["phase"] == "sync"
            send(sock, json.dumps({"rank": 0, "step": 3, "phase": "sync", "done": True}))
            wait_for(lambda: monitor.ranks[0]["done"])
        time.sleep(0.3)
        assert monitor.failure is None  # the rank finished: its bad lines were skipped, not fatal
    finally:
        monitor.close()


def test_start_up_is_bounded_by_the_barrier_timeout():
    cancelled = []
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False, stall_seconds=300, num_ranks=3,
                         startup_seconds=1.0, on_stall=lambda: cancelled.append(time.monotonic()))
    started = time.monotonic()
    try:
        with connect(monitor) as a, connect(monitor) as b:
            send(a, json.dumps({"rank": 0, "step": 0, "phase": "startup"}))
            send(b, json.dumps({"rank": 1, "step": 0, "phase": "load"}))
            wait_for(lambda: bool(cancelled), seconds=5)
    finally:
        monitor.close()
    assert cancelled and 1.0 <= cancelled[0] - started < 3.0
    assert monitor.failure == (
        "start-up took over 1 s (timeouts.barrier_seconds): rank 2 never reported, rank 0 still in startup, "
        "rank 1 still in load; raise timeouts.barrier_seconds for large blocks, or check that executor's log")


def test_a_rank_failure_carries_its_kind():
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False)
    try:
        with connect(monitor) as sock:
            send(sock, json.dumps({"rank": 2, "step": 4, "phase": "sync",
                                   "failed": "TrainingDiverged: training diverged", "kind": "input"}))
            wait_for(lambda: monitor.failure is not None)
    finally:
        monitor.close()
    err = worker_error(RuntimeError("Py4JJavaError: ... at org.apache.spark..."), monitor)
    assert err.kind == "input"
    assert str(err) == "training failed: [blocksync rank 2] TrainingDiverged: training diverged (at step 4, sync)"


PEER_GONE = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6052. This is "
             "typically caused by a remote worker crashing.")


@pytest.mark.parametrize("dead_rank_shows", [True, False])
def test_a_peers_connection_error_yields_to_the_rank_that_died(dead_rank_shows):
    """Rank 0 dies; rank 3's collective notices first and reports "Connection closed by peer" (seen in
    CI). The user must read about rank 0, which caused it; rank 3's error stands only when nothing else shows."""
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False)
    try:
        with connect(monitor) as rank3:
            dying = connect(monitor)
            send(dying, json.dumps({"rank": 0, "step": 3, "phase": "compute"}))
            send(rank3, json.dumps({"rank": 3, "step": 3, "phase": "sync", "failed": PEER_GONE}))
            wait_for(lambda: monitor.consequence is not None and 0 in monitor.ranks)
            assert monitor.failure is None  # a consequence is not the root cause
            if dead_rank_shows:
                threading.Timer(0.5, dying.close).start()  # the death is seen after rank 3's error
            started = time.monotonic()
            error = worker_error(RuntimeError("Python worker exited unexpectedly (crashed)"), monitor)
            waited = time.monotonic() - started
        if not dead_rank_shows:
            dying.close()
    finally:
        monitor.close()
    if dead_rank_shows:
        assert str(error) == ("training failed: rank 0's Python worker ended without finishing; its last heartbeat "
                              "was at step 3 (compute)")
    else:
        assert str(error) == f"training failed: [blocksync rank 3] {PEER_GONE} (at step 3, sync)"
        assert 2.0 <= waited < 4.0  # it waited for a root cause before settling for the consequence


def test_a_rank_that_reported_its_error_is_not_also_a_death():
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False)
    try:
        with connect(monitor) as rank2:
            send(rank2, json.dumps({"rank": 2, "step": 4, "phase": "sync", "failed": PEER_GONE}))
            wait_for(lambda: monitor.consequence is not None)
        time.sleep(0.5)  # its connection ended after its error: that is not a second failure
    finally:
        monitor.close()
    assert monitor.failure is None and monitor.ended_rank is None


def test_the_worker_line_and_its_kind_come_out_of_spark_text():
    text = ("org.apache.spark.SparkException: Job aborted\n"
            "pyspark.errors.exceptions.base.PySparkRuntimeError: [blocksync rank 3 kind=input] ValueError: "
            "rank 3: 2 labels are not class indices\n\tat org.apache.spark.api.python.BasePythonRunner...")
    err = worker_error(RuntimeError(text))
    assert err.kind == "input"
    assert str(err) == "training failed: [blocksync rank 3] ValueError: rank 3: 2 labels are not class indices"
    runtime = worker_error(RuntimeError(text.replace("kind=input", "kind=runtime")))
    assert runtime.kind == "runtime"


def test_a_python_error_before_the_worker_ran_is_extracted():
    text = ("py4j.protocol.Py4JJavaError: An error occurred\n"
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "/x/pyspark/worker.py", line 1, in main\n'
            "    func = read_command()\n"
            "ImportError: cannot import name 'thing' from 'somewhere'\n"
            "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)\n")
    err = worker_error(RuntimeError(text))
    assert str(err) == ("training failed on an executor before the worker started: "
                        "ImportError: cannot import name 'thing' from 'somewhere'")
    missing = worker_error(RuntimeError(text.replace("ImportError: cannot import name 'thing' from 'somewhere'",
                                                     "ModuleNotFoundError: No module named 'blocksync'")))
    assert missing.kind == "input"
    assert "the executors' Python cannot import 'blocksync'" in str(missing)
    assert "spark.pyspark.python" in str(missing)


# A worker process that dies in native code: the message a C++ abort prints, then SIGABRT, as Gloo does.
DYING_WORKER = r"""
import os, sys, time
from blocksync.engine.last_words import StderrRelay
from blocksync.engine.progress import Heartbeat
beat = Heartbeat(sys.argv[1], 1)
beat.at(4, "sync")
beat.flush()
relay = StderrRelay(sys.argv[1], 1)
print("a warning from some library", file=sys.stderr, flush=True)
os.write(2, b"terminate called after throwing an instance of 'gloo::IoException'\n"
            b"  what():  [gloo/transport/tcp/pair.cc:799] connect [127.0.0.1]:41875: Connection refused\n")
time.sleep(0.2)
os.abort()
"""


@pytest.mark.parametrize("dies_with_words", [True, False])
def test_a_native_abort_reaches_the_user_as_its_own_message(tmp_path, dies_with_words):
    import subprocess
    import sys

    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False)
    script = DYING_WORKER if dies_with_words else DYING_WORKER.replace("os.write(2", "0 and os.write(2")
    try:
        proc = subprocess.run([sys.executable, "-c", script, monitor.address], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode < 0  # killed by SIGABRT
        assert "what():  [gloo" in proc.stderr or not dies_with_words  # the relay still copies to the real stderr
        wait_for(lambda: monitor.failure is not None)
        error = worker_error(RuntimeError("Python worker exited unexpectedly (crashed)"), monitor)
    finally:
        monitor.close()
    if dies_with_words:
        assert str(error) == ("training failed: rank 1's Python worker died: [gloo/transport/tcp/pair.cc:799] "
                              "connect [127.0.0.1]:41875: Connection refused (its last heartbeat was at step 4, sync)")
    else:  # no native message: the plain account, with the last thing it printed
        assert str(error) == ("training failed: rank 1's Python worker ended without finishing; its last heartbeat "
                              "was at step 4 (sync); the last line on its stderr: a warning from some library")


@pytest.mark.parametrize("last_seen", [(3, "sync"), (3, "compute"), (0, "startup")])
def test_a_rank_whose_heartbeats_stop_is_named_as_cut_off(last_seen):
    """A pulled cable: every rank waits at the same step inside the collective, but only the cut-off
    rank's heartbeats stop arriving. The watchdog names it and its host, whatever its last beat said:
    beats come every 0.5 s, so with fast steps the last one may predate this step, or even start-up
    (seen in CI). Once another rank is past start-up, start-up is over for all: it is collective."""
    step, phase = last_seen
    stalls = []
    monitor = RunMonitor("127.0.0.1", total_steps=10, show_bar=False, stall_seconds=1.0,
                         on_stall=lambda: stalls.append(time.monotonic()))
    beat = json.dumps({"rank": 0, "step": 3, "phase": "sync"})
    try:
        with connect(monitor) as rank0, connect(monitor) as rank1:
            send(rank1, json.dumps({"rank": 1, "step": step, "phase": phase}))
            started = time.monotonic()
            while not stalls and time.monotonic() - started < 10:  # rank 0 keeps beating, rank 1 is silent
                send(rank0, beat)
                time.sleep(0.5)
            failure = monitor.failure
    finally:
        monitor.close()
    assert stalls, "the watchdog never fired"
    assert failure is not None
    assert failure.startswith(f"stalled: rank 1 on 127.0.0.1 at step {step} ({phase}), silent for ")
    assert "its heartbeats stopped while the other ranks' arrive" in failure
    assert 3.0 <= stalls[0] - started <= 3.0 + 1.5  # SILENT_SECONDS, plus the watchdog tick and a beat
