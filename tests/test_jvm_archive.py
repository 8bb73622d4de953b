"""The JVM class archive local sessions start with (`session.class_archive_option`, `jvm_archive`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blocksync.pipeline import session

REPO = Path(__file__).resolve().parent.parent


def captured_conf(monkeypatch, conf=None) -> dict:
    seen = {}
    monkeypatch.setattr(session, "create_session", lambda builder, c: seen.update(c) or "session")
    session.local_session("local[2]", "probe", conf)
    return seen


def test_local_sessions_name_the_archive_only_when_it_exists(monkeypatch, tmp_path):
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(session, "JVM_ARCHIVE", archive)
    assert "spark.driver.defaultJavaOptions" not in captured_conf(monkeypatch)
    archive.write_bytes(b"recorded")
    assert captured_conf(monkeypatch)["spark.driver.defaultJavaOptions"] == f"-XX:SharedArchiveFile={archive}"
    own = {"spark.driver.defaultJavaOptions": "-Xshare:auto"}  # a user's own setting replaces it
    assert captured_conf(monkeypatch, own)["spark.driver.defaultJavaOptions"] == "-Xshare:auto"


MAPPED = """
import sys
from blocksync.pipeline.session import JVM_ARCHIVE, local_session
# -Xshare:on: a JVM that cannot map the archive (another JDK build, other jars, a damaged file) refuses to
# start, where the default (auto) would start without it.
spark = local_session("local[1]", "archive-probe",
                      {"spark.driver.defaultJavaOptions": f"-XX:SharedArchiveFile={sys.argv[1]} -Xshare:on"})
print(spark.range(5).count())
spark.stop()
"""


def start_with(archive: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAPPED, str(archive)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_the_archive_make_setup_recorded_maps_into_a_local_session(tmp_path):
    if not session.JVM_ARCHIVE.is_file():
        pytest.fail(f"{session.JVM_ARCHIVE} is missing: `make setup` records it "
                    "(python -m blocksync.pipeline.jvm_archive)")
    proc = start_with(session.JVM_ARCHIVE)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "5", proc.stderr[-2000:]
    damaged = tmp_path / "damaged.jsa"
    damaged.write_bytes(session.JVM_ARCHIVE.read_bytes()[:4096])  # the check above can fail
    assert start_with(damaged).returncode != 0
