"""What a stopped command leaves: SIGTERM is handled as Ctrl-C (stage stopped, staging removed, exit 143),
and a killed driver's staging folder is removed by the next command into the same output, or by
`blocksync clean`, once its process is provably gone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from blocksync.pipeline.leftovers import OWNER, owner_record, process_start, sweep, why_dead

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_maker_is_dead_only_when_that_can_be_proved():
    now = time.time()
    me = owner_record()
    assert process_start(os.getpid()) == me["process_start"] is not None
    assert why_dead(me, now, now, 72) is None  # this process: running
    gone = {**me, "pid": dead_pid()}
    assert "that made it is gone" in why_dead(gone, now, now, 72)
    reused = {**me, "process_start": me["process_start"] - 1}  # the same pid, started at another time
    assert "that made it is gone" in why_dead(reused, now, now, 72)
    elsewhere = {**me, "host": "another-host", "pid": dead_pid()}  # its pid says nothing here
    assert why_dead(elsewhere, now, now, 72) is None
    assert why_dead({**elsewhere, "created": now - 73 * 3600}, now, now, 72) == \
        "made on host another-host 73 hours ago (over 72)"
    assert why_dead(None, now - 3600, now, 72) is None
    assert why_dead(None, now - 100 * 3600, now, 72) == "with no owner record 100 hours ago (over 72)"


def test_sweep_removes_what_dead_makers_left_and_keeps_the_rest(spark, tmp_path):
    from blocksync.pipeline.run_files import RunFiles

    def leftover(path: Path, owner: dict | None) -> Path:
        path.mkdir(parents=True)
        (path / "prepared").mkdir()
        if owner is not None:
            (path / OWNER).write_text(json.dumps(owner))
        return path

    me = owner_record()
    dead = leftover(tmp_path / ".out.partial-dead0001", {**me, "pid": dead_pid()})
    live = leftover(tmp_path / ".out.partial-live0001", me)
    unsigned = leftover(tmp_path / ".out.partial-unsigned", None)
    old_unsigned = leftover(tmp_path / ".out.partial-oldunsig", None)
    os.utime(old_unsigned, (time.time() - 80 * 3600, time.time() - 80 * 3600))
    other_run = leftover(tmp_path / ".other.partial-dead0002", {**me, "pid": dead_pid()})
    (tmp_path / "out").mkdir()
    stage = leftover(tmp_path / "out" / ".staging-train-dead0003", {**me, "pid": dead_pid()})
    replaced = leftover(tmp_path / ".out.old-1234abcd", None)
    removed, kept = sweep(RunFiles(spark, str(tmp_path / "out")))
    assert not dead.exists() and not stage.exists() and not replaced.exists() and not old_unsigned.exists()
    assert live.exists() and unsigned.exists() and other_run.exists()
    assert len(removed) == 4 and len(kept) == 2
    assert any(line.startswith(f"{dead}: process ") and "that made it is gone" in line for line in removed)
    assert f"{live}: process {me['pid']} on {socket.gethostname()} may still be running" in kept
    # A previous result whose replacement never arrived is the only copy: named, never removed.
    (tmp_path / "out").rename(tmp_path / "elsewhere")
    swapped = leftover(tmp_path / ".out.old-5678abcd", None)
    removed, kept = sweep(RunFiles(spark, str(tmp_path / "out")))
    assert swapped.exists() and any("the only copy; rename it back" in line for line in kept)


def start_run(tmp: Path, output: Path) -> subprocess.Popen:
    rng = np.random.default_rng(0)
    pd.DataFrame({"a": rng.normal(size=4000), "b": rng.normal(size=4000),
                  "label": rng.integers(0, 3, 4000)}).to_parquet(tmp / "rows.parquet")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "blocksync.pipeline.cli", "run", "--config", "conf/local.yaml", "progress=false",
         "train.backend=torch_gloo", "train.epochs=500", "train.batch_size=16", f"data.source={tmp / 'rows.parquet'}",
         f"output_dir={output}"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def wait_for_training(proc: subprocess.Popen, timeout: float = 240) -> list[str]:
    """Until the run logs its first epoch (the barrier stage is running); returns the stderr lines so far, a
    list that a reader thread keeps filling."""
    lines: list[str] = []
    assert proc.stderr is not None
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any("epoch 1 step" in line for line in lines):
            return lines
        assert proc.poll() is None, "".join(lines)[-2000:]
        time.sleep(0.2)
    raise AssertionError(f"no epoch logged in {timeout} s: {''.join(lines)[-2000:]}")


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [g for c in children for g in descendants(c)]


def test_sigterm_stops_the_barrier_stage_and_removes_the_staging_folder(tmp_path):
    output = tmp_path / "run"
    proc = start_run(tmp_path, output)
    try:
        lines = wait_for_training(proc)
        family = descendants(proc.pid)
        assert list(tmp_path.glob(".run.partial-*"))  # the staging folder exists while it trains
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.time() - sent
        time.sleep(0.5)  # the reader thread takes the last lines
        err = "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == ("blocksync: terminated (SIGTERM): the stage was stopped and its "
                                            "staging folder removed")
    assert not list(tmp_path.glob(".run.partial-*")) and not output.exists()
    time.sleep(2)
    alive = [p for p in family if Path(f"/proc/{p}").exists()]
    assert not alive, f"left behind: {alive}"
    print(f"SIGTERM to exit: {took:.1f} s")


def test_a_killed_drivers_staging_folder_is_removed_by_blocksync_clean(tmp_path):
    output = tmp_path / "run"
    proc = start_run(tmp_path, output)
    try:
        wait_for_training(proc)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and the workers: nothing cleans up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (left,) = tmp_path.glob(".run.partial-*")
    owner = json.loads((left / OWNER).read_text())
    assert owner["pid"] == proc.pid and owner["host"] == socket.gethostname()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    clean = subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", "clean", "--output", str(output)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert f"removed {left}: process {proc.pid} on this host ({socket.gethostname()}) that made it is gone" \
        in clean.stdout
    assert clean.stdout.strip().splitlines()[-1] == "1 removed, 0 kept"
    assert not left.exists()
