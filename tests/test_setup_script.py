"""The set-up script: one script for Makefile, CI and Dockerfile; clear errors for missing prerequisites."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "setup_env.sh"


def test_makefile_ci_and_dockerfile_share_the_setup_script():
    makefile = (REPO / "Makefile").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^setup:\n\tbash scripts/setup_env.sh$", makefile, re.M)
    assert re.search(r"^test: setup\n", makefile, re.M) and re.search(r"^demo: setup\n", makefile, re.M)
    assert "bash scripts/setup_env.sh" in dockerfile
    assert "COPY requirements.lock" in dockerfile
    assert "make test" in (REPO / ".ci" / "run").read_text()
    # The CUDA build argument turns on NCCL through the same script.
    assert "BLOCKSYNC_CUDA=1" in dockerfile
    assert 'HOROVOD_GPU_OPERATIONS=NCCL' in SCRIPT.read_text()


def test_pins():
    lock = {ln.split("==")[0]: ln.split("==")[1] for ln in (REPO / "requirements.lock").read_text().splitlines()
            if "==" in ln and not ln.startswith("#")}
    assert lock["torch"] == "2.13.0"
    assert lock["pyspark"].startswith("4.3.")
    assert int(lock["pandas"].split(".")[0]) < 3
    assert "HOROVOD_VERSION=0.28.1" in SCRIPT.read_text()
    import pandas
    import pyspark
    import torch

    assert torch.__version__.split("+")[0] == lock["torch"]
    assert pyspark.__version__ == lock["pyspark"]
    assert pandas.__version__ == lock["pandas"]


def restricted_path(tmp_path: Path, tools: list[str]) -> str:
    """A PATH holding only `tools` (symlinks to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    (bin_dir / "python3.11").symlink_to(sys.executable)
    return str(bin_dir)


def run_setup(tmp_path: Path, path: str) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": str(tmp_path), "VENV": str(tmp_path / "venv"),
           "BLOCKSYNC_WHEEL_CACHE": str(tmp_path / "empty-cache")}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


BASIC = ["dirname", "cat", "sed", "awk", "ls", "sha256sum", "cut"]


def test_missing_java_is_named(tmp_path):
    proc = run_setup(tmp_path, restricted_path(tmp_path, BASIC))
    assert proc.returncode == 1
    assert "Java not found: Spark 4 needs Java 17" in proc.stderr
    assert not (tmp_path / "venv").exists()  # nothing half-made


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java to get past the Java check")
def test_missing_compiler_is_named_when_no_wheel_is_cached(tmp_path):
    proc = run_setup(tmp_path, restricted_path(tmp_path, [*BASIC, "java"]))
    assert proc.returncode == 1
    assert "no C++ compiler found, and no cached Horovod wheel" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_wrong_python_is_named(tmp_path):
    env = {**os.environ, "PYTHON": "/bin/true-python", "VENV": str(tmp_path / "v")}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Python 3.11 not found (/bin/true-python)" in proc.stderr
