"""The package's and the CLI's entry: lazy public names, settings checked without torch, imports
overlapping the JVM's start, and the console script's exit code. No Spark."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import blocksync
from blocksync.pipeline import cli
from blocksync.pipeline.run_config import load_config

REPO = Path(__file__).resolve().parent.parent


def test_every_public_name_is_the_object_its_module_defines():
    assert sorted(blocksync.__all__) == sorted(blocksync._HOME)
    for name in blocksync.__all__:
        assert getattr(blocksync, name) is getattr(importlib.import_module(blocksync._HOME[name]), name), name
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        blocksync.trian  # noqa: B018


def test_the_cli_checks_the_demo_settings_without_importing_torch():
    # What runs before the JVM starts: if it imported torch, the imports could not overlap the JVM's start.
    code = ("import sys, blocksync, blocksync.pipeline.cli; "
            "from blocksync.pipeline.checks import check_settings; "
            "from blocksync.pipeline.run_config import load_config; "
            "check_settings(load_config('conf/local.yaml', [])); "
            "print(sorted(m for m in ('torch', 'horovod', 'sklearn', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_custom_model_is_still_imported_before_spark_starts(tmp_path):
    from blocksync.pipeline.checks import check_settings

    config = load_config(str(REPO / "conf" / "local.yaml"), ["train.model.name=no_such_module:factory"])
    with pytest.raises(ValueError, match="no_such_module"):
        check_settings(config)


def test_the_stage_modules_load_while_the_session_starts(monkeypatch, tmp_path):
    (tmp_path / "preload_probe.py").write_text("import time\ntime.sleep(0.3)\nLOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: dict[str, object] = {}

    def starting_session(config):
        seen["thread_alive"] = any(t.name == "blocksync-preload" for t in threading.enumerate())
        time.sleep(0.1)
        return "session"

    monkeypatch.setattr(cli, "session_for", starting_session)
    config = load_config(str(REPO / "conf" / "local.yaml"), [])
    assert cli.session_with_preload(config, ["preload_probe"]) == "session"
    assert seen["thread_alive"]
    assert sys.modules["preload_probe"].LOADED  # joined before the session is handed back
    sys.modules.pop("preload_probe")


def test_an_import_that_fails_in_the_preload_fails_again_where_the_stage_imports_it(monkeypatch, tmp_path):
    (tmp_path / "broken_probe.py").write_text("raise ImportError('broken_probe needs a missing library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "session_for", lambda config: "session")
    config = load_config(str(REPO / "conf" / "local.yaml"), [])
    assert cli.session_with_preload(config, ["broken_probe", "json"]) == "session"
    with pytest.raises(ImportError, match="needs a missing library"):
        importlib.import_module("broken_probe")


NEW_MODULES = """
import importlib, json, sys
from blocksync.pipeline import cli
from blocksync.pipeline.run_config import RunConfig, SparkSettings, load_config
from blocksync.pipeline.session import jvm_log_path
for name in cli.SHARED_IMPORTS:
    importlib.import_module(name)
before = set(sys.modules)
if sys.argv[1] == "session":
    cli.session_for(RunConfig(spark=SparkSettings(master="local[2]", app_name="probe", conf={}))).stop()
    jvm_log_path().unlink(missing_ok=True)
else:
    for name in [*cli.stage_modules("run", load_config("conf/local.yaml", [])), "blocksync.pipeline.predict"]:
        importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_starting_a_session_and_the_preload_import_no_module_in_common():
    # Two threads importing one module at once can deadlock on a circular import, and Python then hands
    # one of them a partially initialized module (it happened: pyspark.errors). cli.SHARED_IMPORTS are
    # loaded before the preload thread starts; this finds anything else both sides would import.
    def new_modules(side: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", NEW_MODULES, side], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=300)
        return set(json.loads(out.stdout.strip().splitlines()[-1]))

    session, preload = new_modules("session"), new_modules("preload")
    assert session and "torch" in preload
    assert session & preload == set()


def test_stage_modules_follow_the_stage_and_the_source():
    digits = load_config(str(REPO / "conf" / "local.yaml"), [])
    table = load_config(str(REPO / "conf" / "local.yaml"), ["data.source=/data/table.parquet"])
    assert cli.stage_modules("run", digits) == ["blocksync.pipeline.stages", "sklearn.datasets",
                                                "matplotlib.pyplot"]
    assert cli.stage_modules("train", digits) == ["blocksync.pipeline.stages"]
    assert cli.stage_modules("prepare", table) == ["blocksync.pipeline.stages"]


@pytest.mark.parametrize("entry", ["script", "module", "job"])
def test_the_entry_points_exit_with_the_cli_code(tmp_path, entry):
    argv = {"script": [str(Path(sys.executable).parent / "blocksync"), "run"],
            "module": [sys.executable, "-m", "blocksync.pipeline.cli", "run"],
            "job": [sys.executable, "jobs/pipeline.py"]}[entry]
    out = subprocess.run([*argv, "--config", str(tmp_path / "missing.yaml")], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"blocksync: error: {tmp_path / 'missing.yaml'}: config file not "
                                               "found; pass an existing YAML file such as conf/local.yaml"]


STOP_WHILE_WARMING = """
import json, sys, time
from blocksync.pipeline.session import _children_running, local_session, stop_session, warm_python_daemon
spark = local_session("local[2]", "stop-while-warming")
jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
warming = warm_python_daemon(spark)
deadline = time.monotonic() + 60
while not (daemons := _children_running(jvm_pid, "blocksync.daemon")) and time.monotonic() < deadline:
    time.sleep(0.05)
started = time.monotonic()
stop_session(spark)
stopped = time.monotonic() - started
warming.join(60)
alive = [pid for pid in daemons if _children_running(jvm_pid, "blocksync.daemon").count(pid)]
# What stopping would have waited for: a daemon's whole start, timed in a second session left to finish it.
spark = local_session("local[2]", "warm-to-the-end")
started = time.monotonic()
warm_python_daemon(spark).join(120)
warm_seconds = time.monotonic() - started
stop_session(spark)
print(json.dumps({"daemons": daemons, "alive_after": alive, "warming_alive": warming.is_alive(),
                  "stop_seconds": stopped, "warm_seconds": warm_seconds}))
"""


def test_stopping_a_session_ends_a_python_daemon_that_is_still_starting():
    """A run that fails in its first seconds stops its session while the warm-up task is still starting the
    executors' Python daemon (importing torch); `stop_session` ends that daemon instead of waiting for it."""
    proc = subprocess.run([sys.executable, "-c", STOP_WHILE_WARMING], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["daemons"]) == 1  # found while starting: a child of the JVM running blocksync.daemon
    assert report["alive_after"] == [] and not report["warming_alive"]
    # Not waited for: stopping took a fraction of what starting a daemon takes (about 0.3 s against 5 s here).
    assert report["stop_seconds"] < report["warm_seconds"] / 2, report


def test_children_running_finds_a_child_by_its_module(tmp_path):
    (tmp_path / "sleeper_mod.py").write_text("import time\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-m", "sleeper_mod"], cwd=tmp_path)
    try:
        from blocksync.pipeline.session import _children_running

        deadline = time.monotonic() + 30
        while child.pid not in _children_running(__import__("os").getpid(), "sleeper_mod"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _children_running(__import__("os").getpid(), "other_mod") == []
        assert _children_running(1, "sleeper_mod") == []  # another parent
    finally:
        child.kill()
        child.wait()
