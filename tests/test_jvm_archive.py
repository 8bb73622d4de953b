"""The JVM class archive local sessions start with (`session.class_archive_option`, `jvm_archive`)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from blocksync.pipeline import session


def captured_conf(monkeypatch, conf=None) -> dict:
    seen = {}
    monkeypatch.setattr(session, "create_session", lambda builder, c: seen.update(c) or "session")
    session.local_session("local[2]", "probe", conf)
    return seen


def test_local_sessions_name_the_archive_only_when_it_is_there_whole(monkeypatch, tmp_path, caplog):
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(session, "JVM_ARCHIVE", archive)
    assert "spark.driver.defaultJavaOptions" not in captured_conf(monkeypatch)
    archive.write_bytes(b"recorded")
    session.archive_size_file(archive).write_text("8")
    assert captured_conf(monkeypatch)["spark.driver.defaultJavaOptions"] == f"-XX:SharedArchiveFile={archive}"
    own = {"spark.driver.defaultJavaOptions": "-Xshare:auto"}  # a user's own setting replaces it
    assert captured_conf(monkeypatch, own)["spark.driver.defaultJavaOptions"] == "-Xshare:auto"
    archive.write_bytes(b"rec")  # truncated: a JVM would die of SIGBUS mapping it
    with caplog.at_level(logging.WARNING, logger=session.__name__):
        assert "spark.driver.defaultJavaOptions" not in captured_conf(monkeypatch)
    assert "it is 3 bytes, its recording noted 8; record it again with `make setup`" in caplog.text


MAPPED = """
import sys
from blocksync.pipeline.session import local_session
# -Xshare:on: a JVM that cannot use the archive (another JDK build, other jars, not an archive) refuses
# to start, where the default (auto) would start without it.
options = f"-XX:SharedArchiveFile={sys.argv[1]} -Xshare:on -XX:ErrorFile={sys.argv[2]}/hs_err_%p.log"
spark = local_session("local[1]", "archive-probe", {"spark.driver.defaultJavaOptions": options})
print(spark.range(5).count())
spark.stop()
"""


def start_with(archive: Path, scratch: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAPPED, str(archive), str(scratch)], cwd=scratch,
                          capture_output=True, text=True, timeout=300)


def test_the_archive_make_setup_recorded_maps_into_a_local_session(tmp_path):
    archive = session.JVM_ARCHIVE
    if not archive.is_file():
        pytest.fail(f"{archive} is missing: `make setup` records it (python -m blocksync.pipeline.jvm_archive)")
    assert session.archive_size_file(archive).read_text() == str(archive.stat().st_size)
    proc = start_with(archive, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "5", proc.stderr[-2000:]
    other = tmp_path / "not-an-archive.jsa"
    other.write_bytes(bytes(range(256)) * 400)  # the check above can fail: this one is refused
    refused = start_with(other, tmp_path)
    assert refused.returncode != 0 and "error has occurred while processing the shared archive" in refused.stderr
